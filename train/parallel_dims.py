"""One owner of the device mesh: dp_replicate x dp_shard x cp x tp = world size, every axis named.

    mesh axes: dp_replicate, dp_shard, cp_ring, cp_ulysses, tp     (outermost to innermost)
    flattened: dp = dp_replicate x dp_shard       (the loader shards by this axis only)
               cp = cp_ring x cp_ulysses          (the ranks that split one sequence)

Layouts that cannot work fail here, before any process group is used, with a message saying what
to change.
"""

from __future__ import annotations

from dataclasses import dataclass

CP_KINDS = ("ulysses", "ring", "hybrid")


@dataclass
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    world_size: int
    cp_kind: str = "ulysses"
    sequence_parallel: bool = False  # TP ranks also split the tokens between their projections

    def __post_init__(self):
        degrees = {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "cp": self.cp, "tp": self.tp}
        for name, d in degrees.items():
            if d < 1:
                raise ValueError(f"parallel.{name}={d}: every degree must be >= 1")
        product = self.dp_replicate * self.dp_shard * self.cp * self.tp
        if product != self.world_size:
            raise ValueError(f"parallel degrees dp_replicate*dp_shard*cp*tp = {self.dp_replicate}*{self.dp_shard}*"
                             f"{self.cp}*{self.tp} = {product}, but the world size is {self.world_size}: "
                             "change the degrees or the number of processes")
        if self.cp_kind not in CP_KINDS:
            raise ValueError(f"parallel.cp_kind={self.cp_kind!r}: one of {', '.join(CP_KINDS)}")
        if self.cp_kind == "hybrid" and (self.cp < 4 or self.cp % 2):
            raise ValueError(f"parallel.cp_kind=hybrid needs an even cp >= 4 (Ulysses pairs, ring across); "
                             f"cp={self.cp}")

    @classmethod
    def from_config(cls, cfg, world_size: int) -> ParallelDims:
        return cls(cfg.dp_replicate, cfg.dp_shard, cfg.cp, cfg.tp, world_size, cfg.cp_kind,
                   cfg.get("sequence_parallel", False))

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def ulysses(self) -> int:
        """Ranks that exchange heads by all-to-all: all of cp for Ulysses, pairs for hybrid."""
        return {"ulysses": self.cp, "ring": 1, "hybrid": 2}[self.cp_kind] if self.cp > 1 else 1

    @property
    def ring(self) -> int:
        return self.cp // self.ulysses

    def check_model(self, num_heads: int) -> None:
        if num_heads % self.tp:
            raise ValueError(f"num_heads={num_heads} does not divide by parallel.tp={self.tp}")
        if (num_heads // self.tp) % self.ulysses:
            raise ValueError(f"num_heads={num_heads} does not divide by tp x Ulysses degree = {self.tp} x "
                             f"{self.ulysses}: use fewer Ulysses ranks (cp_kind=ring or hybrid) or more heads")

    def build_mesh(self, device_type: str):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device_type, (self.dp_replicate, self.dp_shard, self.ring, self.ulysses, self.tp),
                                mesh_dim_names=("dp_replicate", "dp_shard", "cp_ring", "cp_ulysses", "tp"))
        mesh[("dp_replicate", "dp_shard")]._flatten("dp")
        mesh[("cp_ring", "cp_ulysses")]._flatten("cp")
        return mesh
