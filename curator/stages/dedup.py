"""Near-duplicate clips by perceptual hash.

A clip carries 64-bit hashes of a few sampled frames and their grid-cell mean colours. Two clips
are near-duplicates when every pair of corresponding hashes is within `max_hamming` bits and their
colours are within `max_colour_diff` (a luma hash alone cannot tell a red ball from a blue one).
Candidates are found through bands of the middle frame's hash: with at most `max_hamming` differing
bits, one of `max_hamming + 1` bands must match exactly (pigeonhole), so lookups stay sub-linear in
the number of kept clips.
"""

from __future__ import annotations

from collections import defaultdict


class DedupIndex:
    def __init__(self, max_hamming: int, max_colour_diff: int = 24):
        if not 0 <= max_hamming < 32:
            raise ValueError(f"dedup.max_hamming={max_hamming}: must be in [0, 32)")
        self.max_hamming, self.max_colour_diff = max_hamming, max_colour_diff
        self.num_bands = max_hamming + 1
        self.bands: dict[tuple[int, int], list[int]] = defaultdict(list)
        self.hashes: list[list[int]] = []
        self.colours: list[list[list[int]]] = []
        self.keys: list[str] = []

    def _band_values(self, h: int):
        width = -(-64 // self.num_bands)
        for b in range(self.num_bands):
            yield b, (h >> (b * width)) & ((1 << width) - 1)

    def find(self, hashes: list[str], colours: list[list[int]]) -> str | None:
        """The key of a kept clip this one duplicates, or None."""
        hs = [int(h, 16) for h in hashes]
        mid = hs[len(hs) // 2]
        seen = set()
        for band in self._band_values(mid):
            for i in self.bands.get(band, ()):
                if i in seen:
                    continue
                seen.add(i)
                other = self.hashes[i]
                if len(other) != len(hs) or len(self.colours[i]) != len(colours):
                    continue
                if all(bin(a ^ b).count("1") <= self.max_hamming for a, b in zip(hs, other, strict=True)) and all(
                        abs(x - y) <= self.max_colour_diff
                        for ca, cb in zip(colours, self.colours[i], strict=True) for x, y in zip(ca, cb, strict=True)):
                    return self.keys[i]
        return None

    def add(self, key: str, hashes: list[str], colours: list[list[int]]) -> None:
        hs = [int(h, 16) for h in hashes]
        i = len(self.hashes)
        self.hashes.append(hs)
        self.colours.append(colours)
        self.keys.append(key)
        for band in self._band_values(hs[len(hs) // 2]):
            self.bands[band].append(i)
