"""The physical order of a KV cache's dimensions (vLLM 0.32's `vllm/v1/kv_cache_layout.py`).

Every layer's cache is logically [L, B, H, N, C]: layer, block, head, entry in the block,
bytes of one cell. A layout names the order those axes have in memory. The planner asks only
three questions of it: is the block axis outermost (one block of every layer is contiguous,
so layers of different page sizes can be packed side by side), is each page one contiguous run
(L and B the two outer axes, so a page can be padded), and is the layer axis outermost.
"""

from __future__ import annotations

from enum import Enum

DIM_L, DIM_B, DIM_H, DIM_N, DIM_C = 0, 1, 2, 3, 4


class KVCacheLayout(Enum):
    """vLLM's layouts; the value is the logical axis found at each physical position."""

    LBHNC = (0, 1, 2, 3, 4)
    LBNHC = (0, 1, 3, 2, 4)
    LHBNC = (0, 2, 1, 3, 4)
    BLHNC = (1, 0, 2, 3, 4)
    BLNHC = (1, 0, 3, 2, 4)
    BHLNC = (1, 2, 0, 3, 4)

    @property
    def is_layer_compact(self) -> bool:
        """The layer axis is outermost: each layer owns one region."""
        return self.value[DIM_L] == 0

    @property
    def is_block_compact(self) -> bool:
        """L and B are the two outermost axes: each page is one contiguous run."""
        return set(self.value[:2]) == {DIM_L, DIM_B}

    @property
    def is_block_outermost(self) -> bool:
        """B is outermost: block b of every layer sits in one contiguous slab."""
        return self.value[0] == DIM_B

    @classmethod
    def from_name(cls, name: str | KVCacheLayout) -> KVCacheLayout:
        """ "BLHNC" -> KVCacheLayout.BLHNC; vLLM's legacy aliases NHD (LBNHC) and HND (LBHNC)
        are accepted too."""
        if isinstance(name, KVCacheLayout):
            return name
        aliases = {"NHD": "LBNHC", "HND": "LBHNC"}
        key = aliases.get(str(name).upper(), str(name).upper())
        if key not in cls.__members__:
            raise ValueError(
                f"unknown KV cache layout {name!r}; allowed: {sorted(cls.__members__)}, "
                "NHD, HND"
            )
        return cls[key]


# vLLM's order of preference when no attention backend declares its layouts
# (`_DEFAULT_LAYOUT_PREFERENCE` in vllm/v1/attention/backends/utils.py): LBNHC first.
DEFAULT_LAYOUT = KVCacheLayout.LBNHC
# DeepSeek V4's indexer backends declare block-outermost layouts only, BLHNC first.
DEEPSEEK_V4_LAYOUT = KVCacheLayout.BLHNC
