"""Byte-level, one-token-per-character tokenizer for the demo policy, built offline (no download).

It is a `Qwen2Tokenizer` (the class `AutoTokenizer` picks for any Qwen2 checkpoint in transformers 5, whatever
``tokenizer_config.json`` says) whose vocabulary holds only the 256 byte symbols and no merges, so every
character (every UTF-8 byte) is one token, plus four special tokens (``<pad>``, ``<bos>``, ``<eos>``,
``<unk>``) and two role markers (``<|user|>``, ``<|assistant|>``) used by a small Jinja chat template::

    <bos><|user|>Add mod 10 up to B: A3 B4 | C2<|assistant|>A3=3 B4=7 answer: 7<eos>

Because it is a `Qwen2Tokenizer`, the saved checkpoint tokenizes the same way whichever loader reads it:
`AutoTokenizer` (which rebuilds a Qwen2 tokenizer from the saved vocabulary), `PreTrainedTokenizerFast`
(which reads ``tokenizer.json`` as is) or vLLM. Encoding never adds special tokens by itself (the template writes
``<bos>``). Padding is on the left (for batched generation). ``decode(encode(text)) == text`` for any text
(NFC-normalized).

Run ``python -m asp.demo.tokenizer`` to print the vocabulary size and an encoded chat.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

BOS, EOS, PAD, UNK = "<bos>", "<eos>", "<pad>", "<unk>"
USER, ASSISTANT = "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, USER, ASSISTANT]
VOCAB_SIZE = len(SPECIAL_TOKENS) + 256

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}" + USER + "{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}" + ASSISTANT + "{{ message['content'] }}{{ eos_token }}"
    "{% else %}{{ raise_exception('the demo chat template supports only user and assistant roles, got '"
    " + message['role']) }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def _vocab() -> dict[str, int]:
    """Special tokens first (ids 0..5), then the 256 byte symbols in byte order (ids 6..261)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for _, symbol in sorted(bytes_to_unicode().items()):
        vocab[symbol] = len(vocab)
    return vocab


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the demo tokenizer (262 tokens); it round-trips through save_pretrained / AutoTokenizer.

    Returns:
        A fast (`tokenizers`-backed) Qwen2 tokenizer with bos/eos/pad/unk set, ``padding_side="left"`` and the
        demo chat template.
    """
    return Qwen2Tokenizer(
        vocab=_vocab(),
        merges=[],
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        extra_special_tokens=[USER, ASSISTANT],
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )


if __name__ == "__main__":
    tk = build_tokenizer()
    chat = [{"role": "user", "content": "Add mod 10 up to B: A3 B4 | C2"}]
    text = tk.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    print(len(tk), repr(text), tk.convert_ids_to_tokens(tk(text)["input_ids"]))
