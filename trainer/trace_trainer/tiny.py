"""python -m trace_trainer.tiny --out DIR --warmup FILE: a tiny Qwen3-shaped
causal LM for the CPU smoke test, made here and now: random weights from a
config (~0.17M parameters), a byte-level BPE tokenizer trained on the spot
on the warm-up transcripts, Qwen3's chat template (TRL's copy, which
renders tool calls and tool results, so TRL recognizes it and parses
<tool_call> blocks), then a short supervised warm-up on the transcripts
(OpenAI-format conversations: system, user, assistant tool calls, tool
results, final answer) so that it calls tools at all — a random model
never does. Nothing is downloaded. The result is a directory
AutoModelForCausalLM/AutoTokenizer load, i.e. a job's base_model."""

import argparse
import json
import os
import sys
import time
from importlib import resources

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
            "<tool_response>", "</tool_response>", "<think>", "</think>"]


def build(out: str, conversations: list, vocab: int = 4096, hidden: int = 64, layers: int = 2,
          steps: int = 500, lr: float = 3e-3, seed: int = 0) -> dict:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    template = resources.files("trl").joinpath("chat_templates/qwen3.jinja").read_text()

    # 1. The tokenizer: byte-level BPE trained on the rendered transcripts.
    bootstrap = PreTrainedTokenizerFast(tokenizer_object=_bpe(["x"], 300, Tokenizer, models, pre_tokenizers, decoders, trainers))
    bootstrap.chat_template = template
    conversations = [dict(c, tools=trainer_tools(c["tools"]) if c.get("tools") else None) for c in conversations]
    texts = [bootstrap.apply_chat_template(c["messages"], tools=c["tools"], tokenize=False) for c in conversations]
    tok = PreTrainedTokenizerFast(tokenizer_object=_bpe(texts, vocab, Tokenizer, models, pre_tokenizers, decoders, trainers),
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = template

    # 2. The model: Qwen3's architecture, tiny, random weights.
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=8192,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None)
    model = Qwen3ForCausalLM(cfg)
    params = sum(p.numel() for p in model.parameters())

    # 3. The warm-up: next-token loss on the assistant turns of the transcripts.
    import random

    batches = []
    for c in conversations:
        for ids, mask in _examples(tok, c):
            batches.append((torch.tensor([ids]), torch.tensor([mask])))
    if not batches:
        raise ValueError("no warm-up example: the conversations have no assistant turn")
    random.Random(seed).shuffle(batches)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    t0 = time.monotonic()
    losses = []
    for step in range(steps):
        ids, mask = batches[step % len(batches)]
        labels = ids.clone()
        labels[mask == 0] = -100
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    model.eval()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {"parameters": params, "vocab": len(tok), "mean_tokens": sum(b[0].shape[1] for b in batches) // len(batches),
            "examples": len(batches), "warmup_steps": steps, "warmup_seconds": round(time.monotonic() - t0, 1),
            "loss_first": round(sum(losses[:10]) / 10, 3), "loss_last": round(sum(losses[-10:]) / 10, 3)}


def trainer_tools(tools: list) -> list:
    """The tools as the trainer shows them to the model: TRL renders the
    methods of the environment class (trace_trainer.environment), sorted by
    name, with schemas from their signatures and docstrings, not the
    server's JSON. A model this small learns the exact prompt it is warmed
    up on and nothing near it (on another rendering it wrote a malformed
    <tool_call> block), so it is warmed up on the trainer's rendering."""
    import inspect

    from .environment import environment_class

    cls = environment_class("http://127.0.0.1:1", tools, None)
    inst = cls.__new__(cls)  # the methods' schemas only: nothing is called
    return [getattr(inst, name) for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]


def _bpe(texts, vocab, Tokenizer, models, pre_tokenizers, decoders, trainers):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    t.train_from_iterator(texts, tr)
    return t


def _examples(tok, conv, max_turns: int = 2):
    """Warm-up examples of a conversation: for each of its first assistant
    turns, the conversation up to that turn rendered as the model sees it
    when it generates that turn (the turn last, after the generation
    prompt), and a mask of the turn's tokens, the target."""
    msgs, tools = conv["messages"], conv.get("tools")
    out = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        if len(out) == max_turns:
            break
        before = tok.apply_chat_template(msgs[:i], tools=tools, tokenize=False, add_generation_prompt=True)
        upto = tok.apply_chat_template(msgs[: i + 1], tools=tools, tokenize=False)
        if not upto.startswith(before):
            continue
        a = tok(before, add_special_tokens=False)["input_ids"]
        ids = tok(upto, add_special_tokens=False)["input_ids"]
        if ids[: len(a)] != a:
            continue
        out.append((ids, [0] * len(a) + [1] * (len(ids) - len(a))))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trace_trainer.tiny", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--warmup", required=True, help="JSON file: a list of {messages, tools} conversations")
    p.add_argument("--steps", type=int, default=500, help="warm-up optimizer steps (default 500)")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate of the warm-up (default 3e-3)")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    a = p.parse_args(argv)
    with open(a.warmup) as f:
        convs = json.load(f)
    info = build(a.out, convs, vocab=a.vocab, hidden=a.hidden, layers=a.layers, steps=a.steps, lr=a.lr)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
