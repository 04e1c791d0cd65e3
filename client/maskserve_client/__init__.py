"""maskserve client: generation with sampling masks, decoded to CSR.

    from maskserve_client import Client, check_mask, replay_numpy
    c = Client("http://127.0.0.1:8080")
    r = c.generate([151644, 872, 198], {"max_tokens": 64, "top_k": 50},
                   mask=True, mode="support", mask_format="packed")
    ch = r.choices[0]
    check_mask(ch.mask, ch.token_ids)
    ch.mask.ids, ch.mask.offsets, ch.mask.logprobs   # CSR arrays

See docs/CLIENT.md.
"""

from .masks import (PACKED_FORMAT, Mask, TopLogprobs, PackedFormatError,
                    MaskFormatError, MaskInvariantError, check_mask,
                    decode_json, decode_packed, decode_top_json,
                    decode_top_packed, encode_packed)
from .client import (Client, Choice, Event, Result, ServerError,
                     decode_choice, decode_event, merge_events)
from .replay import replay_numpy, replay_torch

__all__ = [
    "PACKED_FORMAT", "Mask", "TopLogprobs", "PackedFormatError",
    "MaskFormatError", "MaskInvariantError", "check_mask", "decode_json",
    "decode_packed", "decode_top_json", "decode_top_packed", "encode_packed",
    "Client", "Choice", "Event", "Result", "ServerError", "decode_choice",
    "decode_event", "merge_events", "replay_numpy", "replay_torch",
]

__version__ = "0.1.0"
