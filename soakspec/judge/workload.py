"""What a run's requests were: the spec it ran (its manifest's embedded text) and, per workload,
the shape of the requests it sent. Shared by `soakspec.compare` (two runs that sent different
requests) and the judge (a spec judging a run whose requests it does not describe: `gate --spec`
with a workload edited; the bound on a response's tokens is the max_tokens the run sent)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from soakspec.judge.evidence import Evidence
from soakspec import draws, lengths


def ran_spec(ev: Evidence) -> Any:
    """The spec a run ran (its manifest's embedded text, checked), or None when it has none or
    it does not check with this soakspec."""
    from soakspec.evidence.manifest import recorded_data_files
    from soakspec.lang import load_text

    text = ev.spec_text
    if text is None:
        return None
    try:
        spec, _, _ = load_text(text, f"{ev.root or 'evidence'}/manifest.json#spec", data_optional=True,
                               data_files=recorded_data_files(ev.manifest) if isinstance(ev.manifest, Mapping) else None)
    except Exception:  # noqa: BLE001 - a spec this soakspec cannot read has no workload to compare
        return None
    return spec


def _list(xs: Sequence[Any]) -> str:
    return str(xs[0]) if len(xs) == 1 else "[" + ", ".join(str(x) for x in xs) + "]"


def workload_shape(spec: Any, name: str) -> dict[str, str] | None:
    """What every request of workload `name` looks like (module doc, "Comparable runs"), each
    aspect in words; None when the spec has no such workload."""
    w = next((w for w in spec.workloads if w.name == name), None)
    if w is None:
        return None
    if w.dataset is not None:
        prompt = f"{w.dataset.format} file {w.dataset.path.rsplit('/', 1)[-1]} (sha256 {w.dataset.sha256[:12]})"
    elif w.prompt_file is not None:
        prompt = f"file {w.prompt_file}"
    elif w.prompt_tokens:
        prompt = f"{_list(w.prompt_tokens)} tokens" + (f" ({w.prefix_tokens} shared)" if w.prefix_tokens else "")
        if w.prefix_tokens and w.prefix_groups > 1:  # another count or seed shared other prefixes
            prompt += f" in {w.prefix_groups} prefix groups (seed {w.load.seed})"
    else:
        prompt = f"{w.prompt_words} words"
    if w.prompt_order == "shuffled" and w.prompt_file is not None:  # another order sent other prompts at each index
        prompt += f", {draws.order_label(w.prompt_order, w.load.seed)}"
    if w.multi_turn:
        prompt += ", multi-turn"
        if w.think_time:  # sessions that wait between turns offer the server another pattern (and cache lifetime)
            seeded = f" (seed {w.load.seed})" if len(set(w.think_time)) > 1 else ""
            prompt += f", think time {draws.think_label(w.think_time)}{seeded}"
    replay = w.load.replay
    if replay is not None:
        prompt += f", lengths from {replay.format} trace sha256 {replay.sha256[:12]}"
    max_tokens = "from the prompt file" if w.max_tokens_from_file else _list(w.max_tokens)
    if w.length_range:  # random lengths: a run of ±50% did not send the requests a run of fixed lengths did
        prompt += f", {lengths.label(w.length_range)} (seed {w.load.seed})"
        max_tokens += f" {lengths.label(w.length_range)}"
    sm = w.sampling
    sampling = "greedy" if sm.greedy else f"temperature {sm.temperature:g}, top_p {sm.top_p:g}" + (
        f", top_k {sm.top_k}" if sm.top_k is not None else "")
    if sm.seed is not None:
        sampling += f", seed {sm.seed}"
    return {"model": spec.model.id or "-", "served model name": spec.model.request_name, "endpoint": w.endpoint,
            "stream": "yes" if w.stream else "no", "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": "yes" if w.ignore_eos else "no", "sampling": sampling, "body": w.body_json or "{}"}


def workload_differences(ran: Any, spec: Any, names: Sequence[str], *, hidden: Sequence[str] = (),
                         skip: Sequence[str] = ()) -> list[str]:
    """Each workload of `names` whose requests differ between spec `ran` and spec `spec`:
    'workload 'w': prompt 16 words → 512 words; max_tokens 16 → 64' (a workload either lacks: none).
    `hidden`: aspects named without their values ('body differs': a spec file's body fields may
    hold what a run's embedded text holds redacted); `skip`: aspects not compared."""
    out = []
    for name in dict.fromkeys(names):
        a, z = workload_shape(ran, name), workload_shape(spec, name)
        if a is None or z is None:
            continue
        diff = [f"{k} differs" if k in hidden else f"{k} {a[k]} → {z[k]}" for k in a
                if a[k] != z[k] and k not in skip]
        if diff:
            out.append(f"workload {name!r}: " + "; ".join(diff))
    return out
