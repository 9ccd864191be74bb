"""Running one trial and measuring it: the launcher, the readers that stamp the job's output,
the log adapter, device memory, multi-node trials, the machine's fingerprint; and the guard that
ends every process a campaign started when the campaign's process ends."""
