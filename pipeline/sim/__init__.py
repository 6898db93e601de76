"""The attack simulator, the scorecard, the policy backtest and the static report.

The model, in one paragraph: the simulator produces login attempts as the login service
sees them WITHOUT any gateway enforcement. Every attempt reaches the service, so an
attacker who would have been refused keeps trying, and nothing is ever sent with
``failure_reason = "refused"``. Which attempts a gateway WOULD have refused is computed
afterwards by the scorecard, which replays the decision stream (decisions and
tombstones, in order per key) into a ``DecisionIndex`` and asks it about each attempt at
that attempt's event time. Every event carries a ground-truth label (scenario, actor,
role ``attacker | owner | legit``, cohort) in a truth file written beside the events.

Modules (each command on top of the parts it shares with the others):

* ``scenarios``: deterministic generators (seeded ``random.Random``, no global state);
* ``simulate``: ``authpipe simulate``, to Kafka at a paced rate or to a JSONL file;
* ``truth``: the labelled events, in the order the stream applies them;
* ``outputs``: a policy's decision records and alerts, and the core ``Engine`` run giving
  them; ``output_files`` and ``topics`` read (and write) them from files and topics;
* ``replay``: what a gateway would have answered each attempt under a decision stream;
* ``matching``, ``by_design``, ``scoring``, ``card``, ``card_text``, ``examples``: the
  scorecard's figures (attacks matched, refusals by design, per-attack and legitimate
  counts), its JSON and its text;
* ``scorecard``: ``authpipe scorecard``, per attack time-to-response and misses,
  legitimate attempts refused, alerts matching no attack;
* ``backtest``: ``authpipe backtest``, current vs candidate policy over recorded input
  (``backtest_input``: its input; ``verdicts``: one verdict per attempt; ``parity``: live
  vs replay);
* ``report``: ``authpipe report``, one self-contained HTML file with inline charts.
"""
