//! IPFIX messages (RFC 7011), built with the `netflow_parser` crate's types and its encoder:
//! a template for IPv4 flows, one for IPv6 flows, and an options template saying how frames
//! are sampled (RFC 5477's systematic count-based sampling); then data sets of records.

use netflow_parser::variable_versions::ipfix::lookup::IPFixField;
use netflow_parser::variable_versions::ipfix::{
    Data, FlowSet, FlowSetBody, FlowSetHeader, Header, IPFix, OptionsData, OptionsTemplate, Template, TemplateField,
};
use netflow_parser::{DataNumber, FieldValue};

use super::FlowRecord;

/// Records a message holds: 16 IPv6 records are 1,312 bytes, within one Ethernet MTU.
pub const RECORDS_PER_MESSAGE: usize = 16;

pub const TEMPLATE_V4: u16 = 256;
pub const TEMPLATE_V6: u16 = 257;
pub const TEMPLATE_SAMPLING: u16 = 258;

/// IANA information elements used here: (id, length).
mod ie {
    pub const OCTET_DELTA_COUNT: (u16, u16) = (1, 8);
    pub const PACKET_DELTA_COUNT: (u16, u16) = (2, 8);
    pub const PROTOCOL: (u16, u16) = (4, 1);
    pub const TCP_FLAGS: (u16, u16) = (6, 2);
    pub const SRC_PORT: (u16, u16) = (7, 2);
    pub const SRC_V4: (u16, u16) = (8, 4);
    pub const INGRESS: (u16, u16) = (10, 4);
    pub const DST_PORT: (u16, u16) = (11, 2);
    pub const DST_V4: (u16, u16) = (12, 4);
    pub const EGRESS: (u16, u16) = (14, 4);
    pub const SRC_V6: (u16, u16) = (27, 16);
    pub const DST_V6: (u16, u16) = (28, 16);
    pub const VLAN_ID: (u16, u16) = (58, 2);
    /// RFC 7133's layer2SegmentId: the segment's type in the high byte (1: VXLAN), its id below.
    pub const LAYER2_SEGMENT_ID: (u16, u16) = (351, 8);
    pub const END_REASON: (u16, u16) = (136, 1);
    pub const OBSERVATION_DOMAIN: (u16, u16) = (149, 4);
    pub const START_MS: (u16, u16) = (152, 8);
    pub const END_MS: (u16, u16) = (153, 8);
    pub const SAMPLING_INTERVAL: (u16, u16) = (305, 4);
    pub const SAMPLING_SPACE: (u16, u16) = (306, 4);
}

/// A flow record's fields, in template order, for IPv4 (`v6` false) or IPv6.
fn fields(v6: bool) -> Vec<(u16, u16)> {
    let (src, dst) = if v6 { (ie::SRC_V6, ie::DST_V6) } else { (ie::SRC_V4, ie::DST_V4) };
    vec![
        ie::INGRESS,
        ie::EGRESS,
        ie::VLAN_ID,
        ie::LAYER2_SEGMENT_ID,
        src,
        dst,
        ie::PROTOCOL,
        ie::SRC_PORT,
        ie::DST_PORT,
        ie::TCP_FLAGS,
        ie::PACKET_DELTA_COUNT,
        ie::OCTET_DELTA_COUNT,
        ie::START_MS,
        ie::END_MS,
        ie::END_REASON,
    ]
}

fn template_field((id, len): (u16, u16)) -> TemplateField {
    TemplateField {
        field_type_number: id,
        field_length: len,
        enterprise_number: None,
        field_type: IPFixField::new(id, None),
    }
}

fn template(id: u16, f: &[(u16, u16)]) -> Template {
    Template { template_id: id, field_count: f.len() as u16, fields: f.iter().copied().map(template_field).collect() }
}

fn set(id: u16, body: FlowSetBody) -> FlowSet {
    FlowSet { header: FlowSetHeader { header_id: id, length: 0 }, body }
}

fn message(export_s: u32, sequence: u32, domain: u32, flowsets: Vec<FlowSet>) -> Result<Vec<u8>, String> {
    let header = Header {
        version: 10,
        length: 0,
        export_time: export_s,
        sequence_number: sequence,
        observation_domain_id: domain,
    };
    IPFix { header, flowsets }.to_be_bytes().map_err(|e| e.to_string())
}

fn num(id: u16, v: DataNumber) -> (IPFixField, FieldValue) {
    (IPFixField::new(id, None), FieldValue::DataNumber(v))
}

/// The templates, and the sampling options record: one frame in `sampling`.
pub fn templates(export_s: u32, sequence: u32, domain: u32, sampling: u32) -> Result<Vec<u8>, String> {
    let data = set(
        2,
        FlowSetBody::Templates(vec![template(TEMPLATE_V4, &fields(false)), template(TEMPLATE_V6, &fields(true))]),
    );
    let opt_fields = [ie::OBSERVATION_DOMAIN, ie::SAMPLING_INTERVAL, ie::SAMPLING_SPACE];
    let options = OptionsTemplate {
        template_id: TEMPLATE_SAMPLING,
        field_count: opt_fields.len() as u16,
        scope_field_count: 1,
        fields: opt_fields.iter().copied().map(template_field).collect(),
    };
    let record = vec![
        num(ie::OBSERVATION_DOMAIN.0, DataNumber::U32(domain)),
        num(ie::SAMPLING_INTERVAL.0, DataNumber::U32(1)),
        num(ie::SAMPLING_SPACE.0, DataNumber::U32(sampling - 1)),
    ];
    let sets = vec![
        data,
        set(3, FlowSetBody::OptionsTemplates(vec![options])),
        set(TEMPLATE_SAMPLING, FlowSetBody::OptionsData(OptionsData::new(vec![record]))),
    ];
    message(export_s, sequence, domain, sets)
}

/// One message of `records` (at most `RECORDS_PER_MESSAGE`): a data set for the IPv4 ones and
/// one for the IPv6 ones. `sequence` counts the records sent before.
pub fn records(export_s: u32, sequence: u32, domain: u32, records: &[FlowRecord]) -> Result<Vec<u8>, String> {
    let mut sets = Vec::new();
    for v6 in [false, true] {
        let rows: Vec<Vec<(IPFixField, FieldValue)>> =
            records.iter().filter(|r| r.key.tuple.v6 == v6).map(|r| row(r, v6)).collect();
        if !rows.is_empty() {
            let id = if v6 { TEMPLATE_V6 } else { TEMPLATE_V4 };
            sets.push(set(id, FlowSetBody::Data(Data::new(rows))));
        }
    }
    message(export_s, sequence, domain, sets)
}

/// A record's values, in `fields(v6)`'s order.
fn row(r: &FlowRecord, v6: bool) -> Vec<(IPFixField, FieldValue)> {
    let (k, c) = (&r.key, &r.counts);
    let t = &k.tuple;
    let (src, dst) = if v6 {
        (FieldValue::Ip6Addr(t.src.into()), FieldValue::Ip6Addr(t.dst.into()))
    } else {
        let a = |b: &[u8; 16]| std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]);
        (FieldValue::Ip4Addr(a(&t.src)), FieldValue::Ip4Addr(a(&t.dst)))
    };
    // A flow in a VLAN a VTEP carries: its VNI, as a VXLAN segment (RFC 7133 4.2); 0 otherwise.
    let segment = if r.vni != 0 { 1 << 56 | r.vni as u64 } else { 0 };
    let values = [
        FieldValue::DataNumber(DataNumber::U32(k.ingress)),
        FieldValue::DataNumber(DataNumber::U32(k.egress)),
        FieldValue::DataNumber(DataNumber::U16(k.vlan)),
        FieldValue::DataNumber(DataNumber::U64(segment)),
        src,
        dst,
        FieldValue::DataNumber(DataNumber::U8(t.proto)),
        FieldValue::DataNumber(DataNumber::U16(t.sport)),
        FieldValue::DataNumber(DataNumber::U16(t.dport)),
        FieldValue::DataNumber(DataNumber::U16(c.tcp_flags)),
        FieldValue::DataNumber(DataNumber::U64(c.packets)),
        FieldValue::DataNumber(DataNumber::U64(c.bytes)),
        FieldValue::DataNumber(DataNumber::U64(c.start_ms)),
        FieldValue::DataNumber(DataNumber::U64(c.end_ms)),
        FieldValue::DataNumber(DataNumber::U8(r.reason as u8)),
    ];
    fields(v6).iter().zip(values).map(|(&(id, _), v)| (IPFixField::new(id, None), v)).collect()
}
