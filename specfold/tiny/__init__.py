"""The embedded tiny block-diffusion model: data generator, tokenizer, training (see README.md)."""
