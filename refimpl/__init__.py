"""refimpl: a small, tested, readable reference implementation of LLM KV-cache management.

Part I (`refimpl.paged`, `refimpl.engine`) follows nano-vllm's paged KV cache; Part II
(`refimpl.hybrid`) follows vLLM v1's hybrid KV cache as used for DeepSeek V4. Importing this
package never needs a GPU, Triton or flash-attn: backends are chosen when they are used.
"""

from refimpl.errors import InvariantError

__version__ = "0.1.0"
__all__ = ["InvariantError", "__version__"]
