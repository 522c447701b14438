"""parlab.ledger."""
