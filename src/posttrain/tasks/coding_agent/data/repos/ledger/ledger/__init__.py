"""ledger: accounts, postings in integer cents, and statements."""
