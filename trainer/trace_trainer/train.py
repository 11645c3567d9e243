"""One training job: the plan's LoRA trained with TRL's GRPOTrainer on the
job's environment, played through trace's OpenEnv server; the adapter
evaluated on the held-out seeds before (the base model: a fresh LoRA adds
nothing) and after training, and saved as a PEFT adapter directory."""

import math
import os
import random
import signal
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass

from .environment import EpisodeLog, environment_class, env_url, final_text, start_of


class JobError(Exception):
    """A job that cannot run as specified: reported as failed with this reason."""


class Stopped(JobError):
    """The job stopped before its end because the trainer was asked to stop
    (SIGTERM, SIGINT: stop_requested). The nats worker hands the job back
    to the work queue for another worker; the command protocol (--spec)
    reports it failed with this reason."""


@dataclass
class Options:
    max_completion_length: int = 2048  # per rollout, tool results included (TRL's multi-turn completion)
    max_tool_calls: int | None = None  # default: env_server.max_steps, else 16
    episodes_log: str | None = None  # JSON lines of every episode played (default: <adapter dir>/episodes.jsonl)
    seed: int = 0
    cpu: bool = False  # force the CPU even when CUDA is there


stop_requested = threading.Event()


def _install_sigterm():
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, _frame):
        stop_requested.set()
        print(f"trace-trainer: signal {signum}: stopping after this step", file=sys.stderr)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def adapter_dir(job: dict) -> str:
    uri = job["output"]["uri"]
    u = urllib.parse.urlsplit(uri)
    if u.scheme == "file":
        return urllib.parse.unquote(u.path)
    if u.scheme == "":
        return uri
    raise JobError(f"output.uri: scheme {u.scheme!r} is not supported by the reference trainer (file:// only); "
                   "write to a local path and sync it to your store")


def _rows(url: str, seeds: list, hint_ratio: float, rng: random.Random, log=print) -> list:
    """Dataset rows: the prompt of each seed as the server starts it, the
    seed, and whether it is hinted. Prompts are fetched once per (seed, hint)."""
    cache = {}
    rows = []
    for i, seed in enumerate(seeds):
        hinted = hint_ratio > 0 and rng.random() < hint_ratio
        for h in {False, hinted}:
            if (seed, h) not in cache:
                cache[(seed, h)] = start_of(url, seed, h)
        # plain_prompt: the same start without the hint block, what the
        # gradient step sees when the plan strips hints.
        rows.append({"prompt": cache[(seed, hinted)]["messages"], "plain_prompt": cache[(seed, False)]["messages"],
                     "seed": seed, "hinted": hinted})
    return rows, next(iter(cache.values()))["tools"]


def hint_stripping(GRPOTrainer):
    """GRPOTrainer whose training batches have the hint block removed from
    the prompt of hinted rollouts before the loss (TRACE: the policy is
    trained to act without the hint it was sampled with). The rollout is
    generated and scored as TRL does; only the prompt tokens the loss is
    computed on are replaced by the unhinted prompt's. Sound here because
    the reference trainer generates once per optimizer step
    (steps_per_generation 1, num_iterations 1, no vLLM): TRL keeps no
    old log-probabilities computed on the hinted prompt, and with KL 0 no
    reference log-probabilities either (KL > 0 with stripped hints is
    refused at the start)."""
    import torch
    from trl.trainer.utils import pad

    class HintStrippingGRPOTrainer(GRPOTrainer):
        stripped = 0

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            if not self.model.training or not any(x.get("hinted") for x in inputs):
                return out
            if "old_per_token_logps" in out or "ref_per_token_logps" in out:
                raise RuntimeError("strip_hints: log-probabilities on the hinted prompt were kept; cannot strip")
            tools = self._env_tools[None]
            ids = []
            for x, row, mask in zip(inputs, out["prompt_ids"], out["prompt_mask"]):
                if x.get("hinted"):
                    enc = self.processing_class.apply_chat_template(
                        x["plain_prompt"], tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True,
                        **self.chat_template_kwargs)
                    ids.append(torch.tensor(enc["input_ids"]))
                    self.stripped += 1
                else:
                    ids.append(row[mask.bool()].cpu())
            dev = out["prompt_ids"].device
            out["prompt_ids"] = pad(ids, padding_value=self._tokenizer.pad_token_id, padding_side="left",
                                    pad_to_multiple_of=self.pad_to_multiple_of).to(dev)
            out["prompt_mask"] = pad([torch.ones_like(t) for t in ids], padding_value=0, padding_side="left",
                                     pad_to_multiple_of=self.pad_to_multiple_of).to(dev)
            return out

    return HintStrippingGRPOTrainer


def run(job: dict, emit, opts: Options) -> dict:
    """Runs job, reporting through emit(type, **fields); returns the
    succeeded event's fields. Raises JobError (or anything) on failure: the
    caller reports it as failed; Stopped (a JobError) when stop_requested
    stopped it: the nats worker hands the job back instead."""
    _install_sigterm()
    if stop_requested.is_set():
        raise Stopped("stopped by a signal before the job started")
    t0 = time.monotonic()
    g, lora, ev = job["grpo"], job["lora"], job["eval"]
    out_dir = adapter_dir(job)
    url = env_url(job)
    log_path = opts.episodes_log or os.path.join(out_dir, "episodes.jsonl")
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(log_path):
        os.remove(log_path)
    episodes = EpisodeLog(log_path)

    emit("started", iterations=g["iterations"])

    # Heavy imports after "started": they take seconds.
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(opts.seed)
    rng = random.Random(opts.seed)
    group, groups = g["group_size"], g["groups_per_iteration"]
    per_step = group * groups
    # Training seeds: the plan's range, in a seeded order (never the held-out ones).
    ts = job.get("train_seeds") or {"first": 0, "count": 1000}
    held = set(ev["seeds"])
    pool = [s for s in range(ts["first"], ts["first"] + ts["count"]) if s not in held]
    if not pool:
        raise JobError("train_seeds: no training seed outside the held-out seeds")
    rng.shuffle(pool)
    n_prompts = groups * g["iterations"]
    seeds = [pool[i % len(pool)] for i in range(n_prompts)]
    train_rows, tools = _rows(url, seeds, g["hint_ratio"], rng)
    eval_rows, _ = _rows(url, list(ev["seeds"]), 0.0, rng)
    print(f"trace-trainer: {len(train_rows)} training prompts ({sum(r['hinted'] for r in train_rows)} hinted), "
          f"{len(eval_rows)} held-out seeds, {len(tools)} tools", file=sys.stderr)

    base = job["base_model"]
    cuda = torch.cuda.is_available() and not opts.cpu
    dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)

    Env = environment_class(url, tools, episodes)

    def environment_reward(completions, environments, **kwargs):
        """The reward is trace's: each rollout's final answer ends its
        server-side episode, and the server's reward comes back."""
        return [env._finish(final_text(c)) for c, env in zip(completions, environments)]

    max_tool_calls = opts.max_tool_calls or job["env_server"].get("max_steps") or 16
    args = GRPOConfig(
        output_dir=os.path.join(out_dir, ".trainer"),
        max_steps=g["iterations"],
        per_device_train_batch_size=per_step,
        gradient_accumulation_steps=1,
        num_generations=group,
        num_generations_eval=ev["rollouts_per_seed"],
        per_device_eval_batch_size=ev["rollouts_per_seed"] * max(1, min(len(eval_rows), max(1, groups))),
        learning_rate=g["learning_rate"],
        temperature=g["temperature"],
        beta=g["kl_coef"],
        epsilon=g["clip_epsilon"],
        max_grad_norm=g["max_grad_norm"],
        scale_rewards="group" if g["advantage"] == "group_std" else "none",
        max_completion_length=opts.max_completion_length,
        max_tool_calling_iterations=max_tool_calls,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=not cuda,
        bf16=dtype == torch.bfloat16,
        seed=opts.seed,
        shuffle_dataset=False,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    peft_config = LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                             target_modules=list(lora["target_modules"]), task_type="CAUSAL_LM")

    class Progress(TrainerCallback):
        """One progress event per optimizer step, from TRL's logged metrics
        (reward, reward_std, kl when beta > 0, loss)."""

        def on_step_begin(self, args, state, control, **kw):
            episodes.step = state.global_step + 1

        def on_log(self, args, state, control, logs=None, **kw):
            logs = logs or {}
            if "reward" not in logs or any(k.startswith("eval_") for k in logs):
                return
            played = [r for r in episodes.rows if r["phase"] == "train" and r["step"] == state.global_step]
            emit("progress", iteration=state.global_step, iterations=g["iterations"],
                 mean_reward=float(logs["reward"]), reward_std=max(0.0, float(logs.get("reward_std", 0.0))),
                 kl=float(logs["kl"]) if "kl" in logs and g["kl_coef"] > 0 else None,
                 loss=float(logs["loss"]) if "loss" in logs and math.isfinite(logs["loss"]) else None)
            print(f"trace-trainer: iteration {state.global_step}/{g['iterations']}: mean reward {logs['reward']:.4f} "
                  f"std {logs.get('reward_std', 0.0):.4f} over {len(played)} episodes, "
                  f"tool calls/rollout {logs.get('tools/call_frequency', 0.0):.2f}", file=sys.stderr)

        def on_step_end(self, args, state, control, **kw):
            if stop_requested.is_set():
                control.should_training_stop = True

    strip = bool(g.get("strip_hints", True)) and any(r["hinted"] for r in train_rows)
    if strip and g["kl_coef"] > 0:
        raise JobError("grpo.kl_coef > 0 with strip_hints and hinted rollouts is not supported by the reference trainer "
                       "(the reference model's log-probabilities would be on the hinted prompt)")
    Trainer = hint_stripping(GRPOTrainer) if strip else GRPOTrainer
    trainer = Trainer(
        model=model,
        reward_funcs=environment_reward,
        args=args,
        train_dataset=Dataset.from_list(train_rows),
        eval_dataset=Dataset.from_list(eval_rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        environment_factory=Env,
        callbacks=[Progress()],
    )

    def evaluate(phase: str) -> dict:
        episodes.phase, n = phase, len(episodes.rows)
        trainer.evaluate()
        played = episodes.since(n)
        if not played:
            raise JobError(f"evaluation ({phase}): no episode finished")
        rewards = [r["reward"] for r in played]
        mean = sum(rewards) / len(rewards)
        return {"mean_reward": mean, "success_rate": sum(r >= ev["success_threshold"] for r in rewards) / len(rewards),
                "episodes": len(rewards)}

    # A fresh LoRA's B matrices are zero: before training the model is the base model.
    base_eval = evaluate("eval_base")
    print(f"trace-trainer: base model on the held-out seeds: {base_eval}", file=sys.stderr)
    episodes.phase = "train"
    if stop_requested.is_set():
        raise Stopped("stopped by a signal before the first iteration")
    trainer.train()
    if stop_requested.is_set():
        raise Stopped("stopped by a signal before the last iteration")
    if strip:
        print(f"trace-trainer: hint block stripped from {trainer.stripped} hinted prompts before the gradient step",
              file=sys.stderr)
    final = evaluate("eval")
    print(f"trace-trainer: adapter on the held-out seeds: {final}", file=sys.stderr)

    trainer.model.save_pretrained(out_dir)  # adapter_config.json + adapter_model.safetensors
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        if not os.path.isfile(os.path.join(out_dir, f)):
            raise JobError(f"the saved adapter has no {f} in {out_dir}")
    print(f"trace-trainer: adapter written to {out_dir} in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    result = {"adapter": {"name": job["output"]["adapter_name"], "uri": job["output"]["uri"]},
              "eval": {"mean_reward": _unit(final["mean_reward"]), "success_rate": final["success_rate"],
                       "episodes": final["episodes"], "base_mean_reward": _unit(base_eval["mean_reward"])}}
    return result


def _unit(x: float) -> float:
    return min(1.0, max(0.0, x))
