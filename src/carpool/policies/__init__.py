"""When a batch leaves: the policy contract, eager, fixed, adaptive, cost models; pure."""
