\set id random(1, 100)
UPDATE bystander SET n = n + 1 WHERE id = :id;
