"""From stored UBI records to evidence: sessions, position bias, click models, candidate judgments."""
