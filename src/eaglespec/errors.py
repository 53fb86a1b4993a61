"""The one exception type users see: its message names the problem and the fix."""


class EagleError(ValueError):
    """Bad input (model, head, prompt, option). The CLI prints it as one line and exits non-zero."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """A library's exception as a short single line, for the parenthesis of an EagleError (their
    messages can span lines or quote whole files)."""
    text = " ".join(str(exc).split())
    text = text if len(text) <= limit else text[:limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
