"""Training EAGLE-1 draft heads: conversations -> examples (data), target features (capture),
the paper's loss (loss) and the training loop (trainer); `cli` adds `eaglespec capture` and
`eaglespec train`."""
