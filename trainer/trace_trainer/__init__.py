"""trace's reference trainer (TRACE step 3): LoRA adapters trained with TRL's
GRPOTrainer and PEFT on environments played through trace's OpenEnv
server. It speaks trace's training protocol (docs/training-protocol.md):
the nats protocol (jobs from the JetStream work queue trace.training.jobs,
events on trace.training.events.<job_id>) and the command protocol
(``python -m trace_trainer --spec PATH``: the same events, one JSON object
per line on standard output). See trainer/README.md.
"""

__version__ = "0.1.0"
