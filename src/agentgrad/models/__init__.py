"""Model directories AgentGrad brings in from elsewhere: where they are cached, how a directory
is installed whole or not at all, the ChatML tool-calling chat template, and the GGUF import
(``agentgrad models import-gguf`` / ``agentgrad models smollm2``). See docs/models.md."""
