/* Real functions for DPDK's static-inline fast path, so Rust can call them.
 * Each one is a one-line forward; the compiler inlines DPDK's body here. */
#include "wrapper.h"

uint16_t pvs_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t nb_pkts)
{
	return rte_eth_rx_burst(port_id, queue_id, pkts, nb_pkts);
}

uint16_t pvs_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t nb_pkts)
{
	return rte_eth_tx_burst(port_id, queue_id, pkts, nb_pkts);
}

struct rte_mbuf *pvs_pktmbuf_alloc(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

int pvs_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int count)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

void pvs_pktmbuf_free(struct rte_mbuf *m)
{
	rte_pktmbuf_free(m);
}

void *pvs_pktmbuf_mtod(struct rte_mbuf *m)
{
	return rte_pktmbuf_mtod(m, void *);
}

uint16_t pvs_pktmbuf_data_len(const struct rte_mbuf *m)
{
	return rte_pktmbuf_data_len(m);
}

uint32_t pvs_pktmbuf_pkt_len(const struct rte_mbuf *m)
{
	return rte_pktmbuf_pkt_len(m);
}

uint16_t pvs_pktmbuf_nb_segs(const struct rte_mbuf *m)
{
	return m->nb_segs;
}

uint16_t pvs_pktmbuf_headroom(const struct rte_mbuf *m)
{
	return rte_pktmbuf_headroom(m);
}

uint16_t pvs_pktmbuf_tailroom(const struct rte_mbuf *m)
{
	return rte_pktmbuf_tailroom(m);
}

char *pvs_pktmbuf_append(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_append(m, len);
}

int pvs_pktmbuf_trim(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_trim(m, len);
}

int pvs_pktmbuf_set_len(struct rte_mbuf *m, uint16_t len)
{
	if (m->nb_segs != 1 || m->next != NULL)
		return -1;
	if ((uint32_t)len > (uint32_t)m->buf_len - m->data_off)
		return -1;
	m->data_len = len;
	m->pkt_len = len;
	return 0;
}

void pvs_pktmbuf_reset(struct rte_mbuf *m)
{
	rte_pktmbuf_reset(m);
}

int pvs_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail)
{
	return rte_pktmbuf_chain(head, tail) == 0 ? 0 : -1;
}

void pvs_mbuf_set_tx_offload(struct rte_mbuf *m, uint64_t flags, uint16_t l2, uint16_t l3, uint16_t l4,
			     uint16_t tso_segsz)
{
	m->ol_flags |= flags;
	m->l2_len = l2;
	m->l3_len = l3;
	m->l4_len = l4;
	m->tso_segsz = tso_segsz;
}

uint16_t pvs_tx_prepare(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t nb_pkts)
{
	return rte_eth_tx_prepare(port_id, queue_id, pkts, nb_pkts);
}

/* The flag values dpdk-sys/src/lib.rs spells out (bindgen cannot evaluate RTE_BIT64). */
_Static_assert(RTE_MBUF_F_TX_TCP_SEG == (1ULL << 50), "RTE_MBUF_F_TX_TCP_SEG");
_Static_assert(RTE_MBUF_F_TX_TCP_CKSUM == (1ULL << 52), "RTE_MBUF_F_TX_TCP_CKSUM");
_Static_assert(RTE_MBUF_F_TX_UDP_CKSUM == (3ULL << 52), "RTE_MBUF_F_TX_UDP_CKSUM");
_Static_assert(RTE_MBUF_F_TX_IP_CKSUM == (1ULL << 54), "RTE_MBUF_F_TX_IP_CKSUM");
_Static_assert(RTE_MBUF_F_TX_IPV4 == (1ULL << 55), "RTE_MBUF_F_TX_IPV4");
_Static_assert(RTE_MBUF_F_TX_IPV6 == (1ULL << 56), "RTE_MBUF_F_TX_IPV6");
_Static_assert(RTE_MBUF_F_RX_L4_CKSUM_MASK == ((1ULL << 3) | (1ULL << 8)), "RTE_MBUF_F_RX_L4_CKSUM_MASK");
_Static_assert(RTE_MBUF_F_RX_L4_CKSUM_GOOD == (1ULL << 8), "RTE_MBUF_F_RX_L4_CKSUM_GOOD");
_Static_assert(RTE_ETH_TX_OFFLOAD_IPV4_CKSUM == (1ULL << 1), "RTE_ETH_TX_OFFLOAD_IPV4_CKSUM");
_Static_assert(RTE_ETH_TX_OFFLOAD_UDP_CKSUM == (1ULL << 2), "RTE_ETH_TX_OFFLOAD_UDP_CKSUM");
_Static_assert(RTE_ETH_TX_OFFLOAD_TCP_CKSUM == (1ULL << 3), "RTE_ETH_TX_OFFLOAD_TCP_CKSUM");
_Static_assert(RTE_ETH_TX_OFFLOAD_TCP_TSO == (1ULL << 5), "RTE_ETH_TX_OFFLOAD_TCP_TSO");
_Static_assert(RTE_ETH_TX_OFFLOAD_MULTI_SEGS == (1ULL << 15), "RTE_ETH_TX_OFFLOAD_MULTI_SEGS");
_Static_assert(RTE_ETH_RX_OFFLOAD_IPV4_CKSUM == (1ULL << 1), "RTE_ETH_RX_OFFLOAD_IPV4_CKSUM");
_Static_assert(RTE_ETH_RX_OFFLOAD_UDP_CKSUM == (1ULL << 2), "RTE_ETH_RX_OFFLOAD_UDP_CKSUM");
_Static_assert(RTE_ETH_RX_OFFLOAD_TCP_CKSUM == (1ULL << 3), "RTE_ETH_RX_OFFLOAD_TCP_CKSUM");

int pvs_errno(void)
{
	return rte_errno;
}

void pvs_set_errno(int err)
{
	rte_errno = err;
}

unsigned int pvs_lcore_id(void)
{
	return rte_lcore_id();
}
