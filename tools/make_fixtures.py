#!/usr/bin/env python3
"""Build tiny random Hugging Face models and their reference logits.

Run where torch and transformers are installed:

    python3 tools/make_fixtures.py t/fixtures

For each model it writes <out>/<name>/ with config.json, model.safetensors
(save_pretrained), ref.json and ref.bin.  ref.json holds the vocabulary
size, the token sequences (a prompt followed by a greedy continuation) and
the prompt lengths; ref.bin holds, for each sequence in order, float32
little-endian logits [len(sequence)][vocab] of one causal forward over the
whole sequence, computed in float64 from the saved weights.
"""

import json
import os
import struct
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

VOCAB = 997          # not a power of two
PROMPTS = [[5, 17, 300, 42, 996], [1], [7, 7, 7, 100, 200, 300, 400, 500, 600, 700, 800]]
DECODE_STEPS = 6


def common(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16,
                max_position_embeddings=512, rms_norm_eps=1e-6,
                bos_token_id=1, eos_token_id=2)
    base.update(kw)
    return base


def models():
    yield ("qwen3-tiny", Qwen3ForCausalLM,
           Qwen3Config(**common(rope_theta=10000.0, tie_word_embeddings=True)),
           torch.float32, 11)
    yield ("qwen3-tiny-bf16", Qwen3ForCausalLM,
           Qwen3Config(**common(rope_theta=1000000.0,
                                tie_word_embeddings=False)),
           torch.bfloat16, 12)
    yield ("llama-tiny", LlamaForCausalLM,
           LlamaConfig(**common(rope_theta=500000.0, tie_word_embeddings=False,
                                rope_scaling={"rope_type": "llama3",
                                              "factor": 8.0,
                                              "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 64})),
           torch.float32, 13)
    yield ("qwen2-tiny", Qwen2ForCausalLM,
           Qwen2Config(**common(rope_theta=10000.0, tie_word_embeddings=False,
                                use_sliding_window=False)),
           torch.float32, 14)


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "t/fixtures"
    torch.set_grad_enabled(False)
    for name, cls, cfg, dtype, seed in models():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        cfg._attn_implementation = "eager"
        m = cls(cfg).to(torch.float32)
        randomize(m, seed)
        m = m.to(dtype)
        m.save_pretrained(d, safe_serialization=True)

        # reference: the saved weights, upcast, float64 math
        ref = cls.from_pretrained(d, torch_dtype=torch.float64,
                                  attn_implementation="eager")
        ref.eval()
        seqs, plens, blobs = [], [], []
        for prompt in PROMPTS:
            seq = list(prompt)
            for _ in range(DECODE_STEPS):
                lg = ref(torch.tensor([seq])).logits[0, -1]
                seq.append(int(torch.argmax(lg)))
            logits = ref(torch.tensor([seq])).logits[0].to(torch.float32)
            seqs.append(seq)
            plens.append(len(prompt))
            blobs.append(logits.contiguous().numpy().tobytes()
                         if hasattr(logits, "numpy") else None)
        with open(os.path.join(d, "ref.bin"), "wb") as f:
            for b in blobs:
                f.write(b)
        with open(os.path.join(d, "ref.json"), "w") as f:
            json.dump({"vocab": VOCAB, "sequences": seqs,
                       "prompt_lens": plens,
                       "dtype": str(dtype).replace("torch.", ""),
                       "transformers": transformers.__version__,
                       "torch": torch.__version__}, f)
            f.write("\n")
        print(name, "ok", [len(s) for s in seqs],
              os.path.getsize(os.path.join(d, "model.safetensors")))


if __name__ == "__main__":
    main()
