#!/usr/bin/env python3
"""Write the hand-made seeds of each fuzz target into fuzz/corpus/<name>/.

The seeds are small valid (and a few nearly valid) inputs in each target's
input format (see the comment at the top of each fuzz_*.c), so that the
fuzzer starts from inputs that reach deep into the code.  The committed
corpus also holds inputs the fuzzer found, merged (libFuzzer -merge=1).
"""

import json
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))


def put(name, seed, data):
    d = os.path.join(here, 'corpus', name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'seed-' + seed), 'wb') as f:
        f.write(data)


# parse: mode byte, split byte, body
bodies = {
    'minimal': {'token_ids': [1]},
    'full': {'request_id': 'run-1:step.2_a', 'token_ids': [1, 2, 3],
             'stream': True, 'return_sampling_mask': True,
             'sampling_logprobs_mode': 'support',
             'sampling_params': {'max_tokens': 8, 'min_tokens': 2,
                                 'temperature': 0.7, 'top_k': 20,
                                 'top_p': 0.9, 'min_p': 0.05, 'seed': 7,
                                 'stop_token_ids': [2, 9],
                                 'ignore_eos': False,
                                 'repetition_penalty': 1.1,
                                 'presence_penalty': 0.5,
                                 'frequency_penalty': -0.5,
                                 'logit_bias': {'5': 1.5, '3': -100},
                                 'logprobs': 5}},
    'greedy': {'token_ids': [4, 5], 'sampling_params': {'temperature': 0}},
    'selected': {'token_ids': [7], 'return_sampling_mask': True,
                 'sampling_logprobs_mode': 'selected',
                 'sampling_params': {'max_tokens': 18446744073709551615}},
    'unknown': {'token_ids': [1], 'extra': {'a': [1, {'b': None}]}},
}
for i, (k, v) in enumerate(sorted(bodies.items())):
    body = json.dumps(v).encode()
    put('parse', k, bytes([0x20 | (i << 2) & 0x0c, i * 37]) + body)
put('parse', 'file', bytes([0x02, 0]) + json.dumps(bodies['full']).encode())
put('parse', 'abort', bytes([0x01, 5]) + b'{"request_id":"abc-1"}')
put('parse', 'trailing', bytes([0x00, 0]) + b'{"token_ids":[1]}"')
put('parse', 'bad-number', bytes([0x04, 9])
    + b'{"token_ids":[1e400,-0,2.5],"sampling_params":{"top_k":1e10}}')

# json: kind byte, then values
put('json', 'f32', bytes([0]) + struct.pack('<8f', 0.0, -0.0, 1.0, 0.1,
                                            3.4028235e38, 1e-45, -1.5e-7,
                                            123456790.0)
    + struct.pack('<2I', 0x7fc00000, 0x7f800000))
put('json', 'i32', bytes([1]) + struct.pack('<4i', 0, -1, 2**31 - 1, -2**31))
put('json', 'u32', bytes([2]) + struct.pack('<3I', 0, 9, 2**32 - 1))
put('json', 'i64', bytes([3]) + struct.pack('<3q', 0, -2**63, 2**63 - 1))
put('json', 'u64', bytes([4]) + struct.pack('<2Q', 10**19, 2**64 - 1))


# ring: tail (2 bytes, 16-byte units), head distance (2 bytes), bytes
def row(slot, cookie, token, pos, ids, lps, top, finish=0):
    n = 48 + 4 * len(ids) + 4 * len(lps) + 8 * len(top)
    n = (n + 7) & ~7
    b = struct.pack('<IIQiIIIIfBBBBI', n, slot, cookie, token, pos,
                    len(ids), len(lps), len(top),
                    lps[0] if lps else 0.0, finish, 0, 2 if ids else 0, 0, 0)
    b += b''.join(struct.pack('<i', x) for x in ids)
    b += b''.join(struct.pack('<f', x) for x in lps)
    b += b''.join(struct.pack('<if', i, l) for i, l in top)
    return b + b'\0' * (n - len(b))


def rec(seq, rows, kind=1):
    body = b''.join(rows)
    n = (16 + len(body) + 15) & ~15
    return (struct.pack('<IHHQ', n, kind, len(rows), seq) + body
            + b'\0' * (n - 16 - len(body)))


recs = rec(1, [row(0, 11, 5, 0, [1, 5, 9], [-2.0, -0.5, -1.5],
                   [(5, -0.5), (9, -1.5)]),
               row(3, 12, 7, 4, [], [-0.1], [])])
recs += rec(2, [row(1, 13, -1, 2, [], [], [], finish=3)])
put('ring', 'two-records', struct.pack('<HH', 0, len(recs) // 16) + recs)
pad = struct.pack('<IHHQ', 64, 2, 0, 0) + b'\0' * 48
put('ring', 'pad', struct.pack('<HH', (4096 - 64) // 16,
                               (64 + len(recs)) // 16) + pad + recs)


# safetensors: mode byte; odd: header JSON, NUL, data
hdr = {'__metadata__': {'format': 'pt'},
       'w': {'dtype': 'F32', 'shape': [2, 2], 'data_offsets': [0, 16]},
       'b': {'dtype': 'BF16', 'shape': [3], 'data_offsets': [16, 22]},
       'e': {'dtype': 'F16', 'shape': [0, 4], 'data_offsets': [22, 22]}}
put('safetensors', 'three', bytes([1]) + json.dumps(hdr).encode() + b'\0'
    + bytes(range(22)))
h = json.dumps({'x': {'dtype': 'F32', 'shape': [1],
                      'data_offsets': [0, 4]}}).encode()
put('safetensors', 'raw', bytes([0]) + struct.pack('<Q', len(h)) + h
    + b'\0\0\x80\x3f')

# b64: split seed byte, then the data (also tried as base64 text)
put('b64', 'text', bytes([7]) + b'Zm9vYmFy')
put('b64', 'padded', bytes([1]) + b'Zm9vYg==')
put('b64', 'rows', bytes([200]) + struct.pack('<4i4f', 3, 101, 187, 512,
                                              -0.81, -0.12, -1.5, -30.0))
put('b64', 'long', bytes([42]) + bytes(range(256)) * 3)
