"""`soakspec sim`: run the embedded OpenAI-compatible inference simulator on loopback.

The flags are generated from `soakspec.sim.config.OPTIONS` (one table for the flags, the spec
language's `sim { ... }` block and `sim_argv`). Quantities use the `.soak` units:
`--ttft 50ms`, `--error-rate 5%` (or `0.05`), `--memory-growth 64MiB`.

Start-up, in order: `--runtime-banner` and `--echo-env` lines on stdout; `--startup-delay`;
bind; `--port-file` written (atomically); `soakspec-sim listening on http://HOST:PORT` on stderr.
It lifts its soft open-files limit to the hard one, as vLLM does (a launched server starts with
the limit soakspec was started with, not soakspec's lifted one: runner/fdlimit.py).
SIGINT or SIGTERM stops it at once (listeners closed, streams cancelled, traces written): exit 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable

from soakspec.exitcodes import ExitCode
from soakspec.sim.config import OPTIONS, SimConfig, flag_name
from soakspec.units import Dimension, UnitError, format_duration, format_size, parse_quantity

_DIMENSIONS = {"duration": Dimension.DURATION, "ratio": Dimension.RATIO, "size": Dimension.SIZE}


def _quantity(kind: str) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            return parse_quantity(text, _DIMENSIONS[kind])
        except UnitError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = kind  # argparse names the type in its error message
    return convert


def _show(kind: str, value: object) -> str:
    if kind == "duration":
        return format_duration(float(value))  # type: ignore[arg-type]
    if kind == "size":
        return format_size(float(value))  # type: ignore[arg-type]
    if kind == "ratio":
        return f"{float(value) * 100:g}%%"  # type: ignore[arg-type]
    return str(value)


def configure(parser: argparse.ArgumentParser) -> None:
    for name, opt in OPTIONS.items():
        flag = flag_name(name)
        help_text = opt.help.replace("%", "%%")
        if opt.kind != "bool" and opt.default not in (None, (), 0, 0.0, ""):  # argparse adds the bools' own
            help_text += f" (default: {_show(opt.kind, opt.default)})"
        if opt.kind == "bool":
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=opt.default,
                                help=help_text)
        elif opt.repeatable:
            parser.add_argument(flag, dest=name, action="append", default=None, metavar="TEXT", help=help_text)
        elif opt.kind in _DIMENSIONS:
            parser.add_argument(flag, dest=name, type=_quantity(opt.kind), default=opt.default,
                                metavar=opt.kind.upper(), help=help_text)
        else:
            types = {"int": int, "float": float, "str": str}
            parser.add_argument(flag, dest=name, type=types[opt.kind], default=opt.default,
                                metavar=opt.kind.upper(), help=help_text)


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Raises ValueError (a usage error) for values out of range or a non-loopback host."""
    kwargs = {name: getattr(args, name) for name in OPTIONS}
    for name, opt in OPTIONS.items():
        if opt.repeatable:
            kwargs[name] = tuple(kwargs[name] or ())
    return SimConfig(**kwargs)


def _write_port_file(path: str, port: int) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def _run(config: SimConfig) -> int:
    import trio

    from soakspec.sim.server import serve

    async def stop_on_signal(signals: trio.lowlevel.SignalReceiver, scope: trio.CancelScope) -> None:
        async for signum in signals:
            print(f"soakspec-sim: {signal.Signals(signum).name}, stopping", file=sys.stderr, flush=True)
            scope.cancel()
            return

    failed = False
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop_on_signal, signals, nursery.cancel_scope)
                port = await nursery.start(serve, config)
                if config.port_file:
                    _write_port_file(config.port_file, port)
                print(f"soakspec-sim listening on {_url(config.host, port)}", file=sys.stderr, flush=True)
        except* OSError as group:
            for e in group.exceptions:
                print(f"soakspec sim: error: {e}", file=sys.stderr, flush=True)
            failed = True
    return ExitCode.ABORTED if failed else ExitCode.OK


def main(args: argparse.Namespace) -> int:
    from soakspec.cli import UsageError

    try:
        config = config_from_args(args)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    if config.runtime_banner is not None:
        print(config.runtime_banner, flush=True)
    for name in config.echo_env:
        print(f"{name}={os.environ.get(name, '')}", flush=True)
    import trio

    from soakspec.runner.fdlimit import raise_open_files_limit

    raise_open_files_limit()  # as vLLM lifts its own: a server soakspec launches starts with the user's limit
    return trio.run(_run, config)
