"""`tiny-random`: a small Llama-shaped model with random weights and a character-level tokenizer.

Built in memory in well under a second, with nothing to download, so every test runs on it.
"""

from __future__ import annotations

import string
from typing import cast

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Same shape of template as SmolLM2/ChatML, so chat-template code paths are exercised for real.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    chars = list(string.ascii_letters + string.digits + string.punctuation + " \n\t")
    vocab = {tok: i for i, tok in enumerate(SPECIAL + chars)}
    vocab["<unk>"] = len(vocab)
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens(SPECIAL)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<|pad|>", eos_token="<|im_end|>", bos_token=None, unk_token="<unk>"
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_random_model(
    seed: int = 0, hidden_size: int = 64, num_layers: int = 2
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tok = tiny_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=cast(int, tok.pad_token_id),  # set by tiny_tokenizer: one token, so one id
        eos_token_id=cast(int, tok.eos_token_id),
        bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model.float(), tok
