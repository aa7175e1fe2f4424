//! `pvsgen`: see tools/pvsgen/README.md, or `pvsgen --help`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let cfg = match pvsgen::parse_args(std::env::args().skip(1)) {
        Ok(Some(c)) => c,
        Ok(None) => {
            print!("{}", pvsgen::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("pvsgen: {e}\n\n{}", pvsgen::USAGE);
            return ExitCode::from(2);
        }
    };
    pvsgen::raise_fd_limit();
    let report = match pvsgen::run(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pvsgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !cfg.quiet {
        print!("{}", report.table());
    }
    if let Some(path) = &cfg.json {
        let text = serde_json::to_string_pretty(&report.to_json()).unwrap() + "\n";
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("pvsgen: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
