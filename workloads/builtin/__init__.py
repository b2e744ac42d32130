"""The built-in workloads' models: a GPT over packed documents, linear regression with a known
noise scale, Hugging Face causal LMs."""
