"""The `eaglespec` command: commands.py (the entry point `main`, and generate, tune, compile),
options.py (the options every model-loading sub-command shares, and `load_generator`), chat.py.

This package imports nothing when it is imported, so a sub-command module can import
cli.options without pulling in the parser that registers it. The names the former cli.py module
had (`from eaglespec.cli import main`, ...) are looked up in their new modules on first use.
"""

_MOVED = {name: "commands" for name in ("main", "build_parser", "cmd_generate", "cmd_compile", "cmd_tune",
                                        "sharegpt_prompts")}
_MOVED.update({name: "options" for name in ("DEFAULT_PROMPT", "add_model_args", "add_compile_arg",
                                            "add_sampling_args", "check_model_args", "load_generator")})


def __getattr__(name: str):
    if name not in _MOVED:  # a submodule (`from eaglespec.cli import chat`) is found by the import system
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import commands, options

    return getattr(commands if _MOVED[name] == "commands" else options, name)
