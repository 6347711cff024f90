"""The switched scale-up network of a supernode (fabric.fidelity=switch).

CloudMatrix384 (2506.12708 §3.3, REFERENCE §1): each node has 7 L1 UB switch chips, one per
sub-plane; every die reaches all 7 over its lanes (its 196 GB/s port = 7 lanes); each L1 chip has
16 links up to the 16 L2 chips of its sub-plane, and each L2 chip one port per node (48). The Clos
is non-blocking: a node's uplinks carry as much as its dies' ports.

What the switch adds to the die-port model:
- ports run at their nominal rate, shared by every flow through them; a single flow is capped at
  its tier's measured β (per-pair rate). Fan-out over many peers can therefore fill a port that one
  flow cannot, and N senders into one receiver share its port (incast);
- a node's uplinks (L1→L2) and downlinks (L2→L1) are a port group per node, loaded by the
  inter-node bytes of the node's dies (spray routing spreads them over all links): one fluid
  resource per node and direction, so constraints scale with the ops' nodes, not their ranks.
Per-hop latency stays inside the tiers' α (StrataCL Table 1): inter-node (L1→L2→L1) − intra-node
(L1) = 2.1 − 0.7 µs = two extra switch hops of 0.7 µs.
"""

from __future__ import annotations

from stratacl.config import SwitchConfig


class SwitchModel:
    def __init__(self, cfg: SwitchConfig, dies_per_node: int, port_Bps: float) -> None:
        self.cfg = cfg
        self.dies_per_node = dies_per_node
        self.links_per_node = cfg.l1_per_node * cfg.l2_per_plane
        self.uplink_Bps = self.links_per_node * cfg.link_GBps * 1e9  # a node's uplinks, one direction
        # non-blocking: the uplinks carry all the node's die ports can send, so their constraint
        # can never bind and is left out (exactly); a tapered Clos keeps it
        self.blocking = self.uplink_Bps < dies_per_node * port_Bps * (1 - 1e-9)

    def uplink_seconds(self, inter_node_bytes_per_die: float, dies_in_node: int) -> float:
        """Seconds of a node's uplink group (at full capacity) that `dies_in_node` members each
        sending `inter_node_bytes_per_die` beyond the node take under spray routing."""
        return inter_node_bytes_per_die * dies_in_node / self.uplink_Bps
