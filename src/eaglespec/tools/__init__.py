"""Jobs a user runs on their own: `eaglespec certify` (certify), the prepared GPU check
(`python -m eaglespec.tools.device_check`) and the GPU head recipe
(`python -m eaglespec.tools.gpu_recipe`). See docs/architecture.md."""
