"""The generation engine: the one request type (request) and its one preparation (prepare), how
tokens are chosen and when generation ends (sampling, logit processors, grammars, tool calls,
stop rules, the prompt cache), the step-wise generator that drives one sequence or a batch of
them over slm.model's network, and the continuous-batching scheduler with its typed Handle. It
runs requests on a Target (target) and imports nothing above slm.model."""
