"""Step-wise models: sequences that join and leave a shared batch at every step."""
