"""Benign hardware background on healthy GPUs: what a real fleet shows with nothing wrong.

Real GPUs are not perfectly clean. Correctable (single-bit) ECC errors, PCIe replays and
NVLink CRC flit errors trickle in on healthy hardware, concentrated on a few parts, and
`DCGM_FI_DEV_XID_ERRORS` holds the last XID until the GPU is reset, so an application error
(13, 31, 43) an earlier job caused stays on the gauge under the next, healthy job. Goodput
must not act on any of it. failures.md gives no background rates; the ones here are chosen
low, from these public figures, and kept far below what alerts or the detector call
degradation (GoodputGPUDegradation: > 10 SBE or > 10 PCIe replays in 5 minutes,
alertmanager/alerts.yaml; the detector's allowances: 100 SBE, 50 replays, 100 CRC flits over
a GPU's first sight, detector/fields.py):

- SBE. ORNL's Titan (18,688 GPUs, 22 months) counted ~120,000 SBEs, about 1 per GB of GPU
  memory, most of them on a small share of the cards (Tiwari et al., HPCA 2015): scaled to an
  H200's 141 GB that is ~0.01 per GPU-hour on an ordinary card (`SBE_PER_HOUR`), and a card
  with a weak spot repeats (`LEAKY`: 1 GPU in 16 at 2 an hour).
- PCIe replays. DCGM's health check calls more than 8 replays a minute a problem (NVIDIA/DCGM
  dcgm_gpu_hardware_limits.h: "the maximum recommended by RM"); a healthy link replays now and
  then (`REPLAYS_PER_HOUR`), a marginal one (1 GPU in 16) 2 an hour.
- NVLink CRC flit errors. The same header: "CRC errors only matter at rates of 100+ per
  second"; a noisy link (1 GPU in 8) logs 4 an hour here.

Over the 8-hour healthy scenario a leaky GPU gains ~16 SBE (a fifth of the detector's
allowance, and never 11 in 5 minutes: P ~ 1e-15). Counters also start where a fleet's do: a
lifetime SBE count (`..._AGG_TOTAL`) and replay/CRC counts since boot on the parts that have
them, volatile counts small. The draws come from their own generator (seeded from the run's
seed), so the scenarios' other random streams stay as they were.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

SBE = ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL")
REPLAY = ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",)
CRC = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",)

SBE_PER_HOUR = 0.01  # every GPU: ~1 SBE per GB per 22 months (Titan), x 141 GB
REPLAYS_PER_HOUR = 0.05  # every GPU: a healthy link replays now and then
# (share of GPUs, events an hour) of the parts with a weak spot
LEAKY = (1 / 16, 2.0)  # correctable ECC errors on a card with a weak cell
MARGINAL = (1 / 16, 2.0)  # PCIe replays on a marginal link
NOISY_LINK = (1 / 8, 4.0)  # NVLink CRC flit errors on a noisy link
GAP_S = 60.0  # a GPU unseen this long (its node was down) starts its trickle afresh
APPLICATION_XIDS = (13, 31, 43)  # what an earlier job may leave on the XID gauge


@dataclass
class Trickle:
    """One GPU's background: Poisson events per counter group, drawn as exponential gaps
    from `rng` (events an hour; `next` the time of each group's next event)."""

    rng: random.Random
    rates: dict[tuple[str, ...], float]
    next: dict[tuple[str, ...], float] = field(default_factory=dict)
    last: float = float("-inf")

    def tick(self, counters: dict[str, float], now: float) -> None:
        """Add the events due by `now` to `counters`."""
        fresh = now - self.last > GAP_S
        self.last = now
        for fields, per_hour in self.rates.items():
            t = self.next.get(fields)
            if t is None or fresh:
                t = now + self.rng.expovariate(per_hour / 3600.0)
            while t <= now:
                for f in fields:
                    counters[f] += 1
                t += self.rng.expovariate(per_hour / 3600.0)
            self.next[fields] = t


def apply(cluster: Any, spec: Any, seed: int) -> None:
    """Give every GPU of `cluster` its background (`spec`: the scenario's `background`; None
    or scale 0: perfectly clean hardware) and the stale XIDs the scenario names."""
    if spec is None:
        return
    for stale in spec.stale_xids:  # (a cluster sized apart from its scenario may lack one)
        node = cluster.nodes.get(stale.node)
        if node is not None and stale.gpu < len(node.gpus):
            node.gpus[stale.gpu].xid = stale.xid
    if spec.scale <= 0:
        return
    rng = random.Random(f"goodput-sim-background/{seed}")
    for node in cluster.nodes.values():
        for g in node.gpus:
            rates = {SBE: SBE_PER_HOUR, REPLAY: REPLAYS_PER_HOUR}
            c = g.counters
            c[SBE[1]] += rng.randint(0, 3)  # a lifetime count: earlier corrected errors
            for fields, (share, per_hour), since_boot in (
                (SBE, LEAKY, (0, 40)),
                (REPLAY, MARGINAL, (0, 30)),
                (CRC, NOISY_LINK, (0, 60)),
            ):
                if rng.random() < share:
                    rates[fields] = per_hour
                    for f in fields:
                        c[f] += rng.randint(*since_boot)
            if c[SBE[1]] < c[SBE[0]]:
                c[SBE[1]] = c[SBE[0]]  # the lifetime count holds the volatile one
            rates = {k: v * spec.scale for k, v in rates.items()}
            g.trickle = Trickle(random.Random(rng.getrandbits(64)), rates)
