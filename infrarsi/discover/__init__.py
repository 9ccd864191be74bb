"""What ``infrarsi init`` learns about a job before any campaign: the command as typed
(``command``), the flags its parser knows (``command.help_flags``, ``settings``), the
trainer family and the levers it has (``levers``), a short dry run (``dry_run``,
``log_patterns``), and the spec drafted from all of it (``draft``, ``contract_draft``,
``init``). ``infrarsi.cli`` only parses the arguments of ``infrarsi init`` and prints."""
