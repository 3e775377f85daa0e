DROP FUNCTION IF EXISTS onceflow.effect_lease_claim_many(text[], text[], text[], text[], interval[]);
