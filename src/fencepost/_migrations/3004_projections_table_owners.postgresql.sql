-- Which projection keeps each table on this target (its live tables and their shadow copies). A
-- builder records its projection's tables here before creating them, and refuses a table another
-- projection name recorded: two projections writing one table would overwrite, reset and swap each
-- other's rows. Tables created before this migration are recorded by the first builder to use them.
CREATE TABLE projection_tables (
    table_name TEXT NOT NULL PRIMARY KEY,
    projection TEXT NOT NULL
);
