"""OpenAI's API on the inference path."""
