"""Runtime: launching through torchrun, rank context, timeouts, test helpers."""
