"""Training EAGLE-1 draft heads: conversations -> examples (data), target features (capture),
the paper's loss (loss) and the training loop (trainer), data-parallel across processes
(distributed); `cli` adds `eaglespec capture` and `eaglespec train`."""
