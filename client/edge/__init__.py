"""The device app: `fedveil client`, its data readers, local policy, SuperNode and
ClientApp, and the ledger heads it witnesses."""
