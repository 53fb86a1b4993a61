"""The one exception type users see: its message names the problem and the fix."""


class EagleError(ValueError):
    """Bad input (model, head, prompt, option). The CLI prints it as one line and exits non-zero."""
