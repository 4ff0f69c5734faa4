"""Configs from other tools' files: a Hugging Face ``config.json`` (hf.py) and a
Megatron-LM command line (megatron_args.py). Pure Python, no network."""
