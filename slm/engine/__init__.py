"""The generation engine: how tokens are chosen and when generation ends (sampling, logit
processors, grammars, tool calls, stop rules, the prompt cache) and the step-wise generator that
drives one sequence or a batch of them over slm.model's network."""
