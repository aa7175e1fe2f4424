/* Headers pvswitch binds, plus the prototypes of the C shim (shim.c) that turns DPDK's
 * static-inline fast path into real, linkable functions. */
#ifndef PVS_DPDK_WRAPPER_H
#define PVS_DPDK_WRAPPER_H

#include <rte_config.h>
#include <rte_common.h>
#include <rte_errno.h>
#include <rte_eal.h>
#include <rte_lcore.h>
#include <rte_dev.h>
#include <rte_mempool.h>
#include <rte_mbuf.h>
#include <rte_ethdev.h>

/* Fast path: Rx/Tx bursts. */
uint16_t pvs_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t nb_pkts);
uint16_t pvs_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t nb_pkts);

/* Mbuf allocation and release. */
struct rte_mbuf *pvs_pktmbuf_alloc(struct rte_mempool *mp);
int pvs_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int count);
void pvs_pktmbuf_free(struct rte_mbuf *m);

/* Mbuf data access (first segment). */
void *pvs_pktmbuf_mtod(struct rte_mbuf *m);
uint16_t pvs_pktmbuf_data_len(const struct rte_mbuf *m);
uint32_t pvs_pktmbuf_pkt_len(const struct rte_mbuf *m);
uint16_t pvs_pktmbuf_nb_segs(const struct rte_mbuf *m);
uint16_t pvs_pktmbuf_headroom(const struct rte_mbuf *m);
uint16_t pvs_pktmbuf_tailroom(const struct rte_mbuf *m);
char *pvs_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
int pvs_pktmbuf_trim(struct rte_mbuf *m, uint16_t len);
/* Sets data_len = pkt_len = len on a single-segment mbuf; -1 if it does not fit or is chained. */
int pvs_pktmbuf_set_len(struct rte_mbuf *m, uint16_t len);
void pvs_pktmbuf_reset(struct rte_mbuf *m);
/* Links `tail` after the last segment of `head` (rte_pktmbuf_chain); -1 if the chain would be too long. */
int pvs_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail);

/* Offloads of a frame to send: ORs `flags` into ol_flags, sets l2/l3/l4_len and tso_segsz. */
void pvs_mbuf_set_tx_offload(struct rte_mbuf *m, uint64_t flags, uint16_t l2, uint16_t l3, uint16_t l4,
			     uint16_t tso_segsz);
/* rte_eth_tx_prepare: the driver checks (and fixes up) offload requests before tx_burst. */
uint16_t pvs_tx_prepare(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t nb_pkts);

/* Per-lcore state. */
int pvs_errno(void);
void pvs_set_errno(int err);
unsigned int pvs_lcore_id(void);

#endif
