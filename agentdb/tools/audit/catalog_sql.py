"""The catalog statements the audit runs: static text, parameters only, pg_catalog only.

``%s`` is the audited schema's oid (or its name, for :data:`SCHEMA`). Every
statement is read by :func:`agentdb.tools.audit.catalog.snapshot`.
"""

from __future__ import annotations

from typing import Final, LiteralString

__all__ = [
    "CITUS",
    "CITUS_TABLES",
    "COLUMNS",
    "CONSTRAINTS",
    "CONTEXT",
    "ELEVATED_MEMBERS",
    "GRANTS",
    "INDEXES",
    "PARTITION_ACCESS",
    "PARTITION_INDEXES",
    "POLICIES",
    "ROUTINES",
    "RULES",
    "SCHEMA",
    "TABLES",
    "TRIGGERS",
]

# --- catalog statements --------------------------------------------------------
# Static text, parameters only; every statement reads pg_catalog. %s is the
# schema's oid (or name, for the lookup).

CONTEXT: Final[LiteralString] = """
SELECT current_user::text, current_database()::text, current_schema()::text,
       split_part(current_setting('server_version'), ' ', 1),
       current_setting('transaction_read_only'),
       r.rolsuper, r.rolbypassrls
FROM pg_roles r
WHERE r.rolname = current_user
"""

SCHEMA: Final[LiteralString] = """
SELECT n.oid, quote_ident(n.nspname) FROM pg_namespace n WHERE n.nspname = %s
"""

# Ordinary, partitioned and foreign tables; partitions are read through their
# root (their rows are the root's), views and sequences are not tables.
TABLES: Final[LiteralString] = """
SELECT c.oid, c.relname::text, quote_ident(c.relname), c.relrowsecurity, c.relforcerowsecurity,
       pg_get_userbyid(c.relowner)::text, c.relkind::text, c.relpersistence::text,
       ARRAY(SELECT a.attname::text
             FROM pg_partitioned_table pt
             CROSS JOIN LATERAL unnest(pt.partattrs::int2[]) AS k (num)
             JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = k.num
             WHERE pt.partrelid = c.oid),
       (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid)::int
FROM pg_class c
WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p', 'f') AND NOT c.relispartition
ORDER BY c.relname
"""

# Domains are resolved to their base type; enum labels and domain CHECKs come
# along so a state column's value set can be read whichever way it is declared.
COLUMNS: Final[LiteralString] = """
SELECT a.attrelid, a.attname::text, quote_ident(a.attname), a.attnotnull,
       format_type(a.atttypid, a.atttypmod), coalesce(bt.typname, t.typname)::text,
       ARRAY(SELECT e.enumlabel::text FROM pg_enum e
             WHERE e.enumtypid = coalesce(bt.oid, t.oid) ORDER BY e.enumsortorder),
       ARRAY(SELECT pg_get_constraintdef(d.oid) FROM pg_constraint d
             WHERE d.contypid = a.atttypid AND d.contype = 'c' ORDER BY d.conname),
       a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '',
       a.attgenerated <> ''
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype
WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p', 'f') AND NOT c.relispartition
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum
"""

CONSTRAINTS: Final[LiteralString] = """
SELECT con.conrelid, con.conname::text, quote_ident(con.conname), con.contype::text,
       ARRAY(SELECT a.attname::text
             FROM unnest(con.conkey) WITH ORDINALITY AS k (num, ord)
             JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.num
             ORDER BY k.ord),
       con.confrelid,
       CASE WHEN con.contype = 'f' THEN con.confrelid::regclass::text END,
       ARRAY(SELECT a.attname::text
             FROM unnest(con.confkey) WITH ORDINALITY AS k (num, ord)
             JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.num
             ORDER BY k.ord),
       con.confdeltype::text, pg_get_constraintdef(con.oid)
FROM pg_constraint con
JOIN pg_class c ON c.oid = con.conrelid
WHERE c.relnamespace = %s AND con.contype IN ('p', 'u', 'f', 'c', 'x')
ORDER BY con.conrelid, con.conname
"""

# Key columns only (INCLUDE columns cannot make a row unique); '' marks an
# expression column.
INDEXES: Final[LiteralString] = """
SELECT x.indrelid, i.relname::text, x.indisunique, x.indisprimary,
       ARRAY(SELECT coalesce(a.attname::text, '')
             FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k (num, ord)
             LEFT JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.num
             WHERE k.ord <= x.indnkeyatts
             ORDER BY k.ord),
       pg_get_expr(x.indexprs, x.indrelid), pg_get_expr(x.indpred, x.indrelid),
       EXISTS (SELECT 1 FROM pg_constraint con
               WHERE con.conindid = x.indexrelid AND con.conrelid = x.indrelid
                 AND con.contype IN ('p', 'u', 'x')),
       x.indisvalid
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class c ON c.oid = x.indrelid
WHERE c.relnamespace = %s
ORDER BY x.indrelid, i.relname
"""

# Unique indexes that live only on partitions (a partitioned root may have
# none of its own): read with the partition's root and how many partitions
# carry the same key, so a key on every partition counts for the root.
PARTITION_INDEXES: Final[LiteralString] = """
SELECT pg_partition_root(c.oid)::oid, c.relname::text,
       ARRAY(SELECT coalesce(a.attname::text, '')
             FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k (num, ord)
             LEFT JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.num
             WHERE k.ord <= x.indnkeyatts
             ORDER BY k.ord),
       pg_get_expr(x.indexprs, x.indrelid), pg_get_expr(x.indpred, x.indrelid), i.relname::text
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class c ON c.oid = x.indrelid
WHERE c.relnamespace = %s AND c.relispartition AND x.indisunique AND x.indisvalid
  AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = x.indexrelid)
ORDER BY 1, 2, i.relname
"""

TRIGGERS: Final[LiteralString] = """
SELECT t.tgrelid, t.tgname::text, t.tgtype::int, t.tgenabled::text,
       ARRAY(SELECT a.attname::text FROM unnest(t.tgattr::int2[]) AS k (num)
             JOIN pg_attribute a ON a.attrelid = t.tgrelid AND a.attnum = k.num),
       p.proname::text, p.prosrc, t.tgqual IS NOT NULL
FROM pg_trigger t
JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_proc p ON p.oid = t.tgfoid
WHERE c.relnamespace = %s AND NOT t.tgisinternal
ORDER BY t.tgrelid, t.tgname
"""

# Partitions (at any depth) of the schema's partitioned tables that a role other
# than their owner was granted something on and that do not force row-level
# security of their own: the root's policies do not apply to a query that names
# the partition, so that role reads (or writes) every tenant's rows through it.
PARTITION_ACCESS: Final[LiteralString] = """
SELECT p.oid, quote_ident(n.nspname) || '.' || quote_ident(c.relname)
FROM pg_class p
CROSS JOIN LATERAL pg_partition_tree(p.oid) AS t
JOIN pg_class c ON c.oid = t.relid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE p.relnamespace = %s AND p.relkind = 'p' AND NOT p.relispartition AND t.relid <> p.oid
  AND c.relkind IN ('r', 'p')
  AND NOT (c.relrowsecurity AND c.relforcerowsecurity)
  AND EXISTS (SELECT 1 FROM aclexplode(c.relacl) AS a WHERE a.grantee <> c.relowner)
ORDER BY 1, 2
"""

RULES: Final[LiteralString] = """
SELECT r.ev_class, r.rulename::text, r.ev_type::text, r.is_instead, r.ev_qual::text <> '<>'
FROM pg_rewrite r
JOIN pg_class c ON c.oid = r.ev_class
WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p') AND r.ev_enabled <> 'D'
ORDER BY r.ev_class, r.rulename
"""

# polroles holds 0 for PUBLIC. The last column: the USING expression reads a
# column at all (a Var node in its tree) - USING (1 = 1), (true OR false) or
# (current_setting('app.admin') = 'on') read none, and open every row or none.
POLICIES: Final[LiteralString] = """
SELECT p.polrelid, p.polname::text, p.polpermissive,
       ARRAY(SELECT CASE WHEN u.role_oid = 0 THEN 'public'
                         ELSE pg_get_userbyid(u.role_oid)::text END
             FROM unnest(p.polroles) AS u (role_oid) ORDER BY 1),
       pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid),
       coalesce(p.polqual::text LIKE '%%{VAR %%', false)
FROM pg_policy p
JOIN pg_class c ON c.oid = p.polrelid
WHERE c.relnamespace = %s
ORDER BY p.polrelid, p.polname
"""

# Grants to anyone but the table's owner (grantee 0 is PUBLIC), on the table or
# on any of its columns: GRANT UPDATE (event_type) lets that role change rows.
GRANTS: Final[LiteralString] = """
SELECT c.oid, CASE WHEN a.grantee = 0 THEN 'public' ELSE pg_get_userbyid(a.grantee)::text END,
       a.privilege_type
FROM pg_class c
CROSS JOIN LATERAL aclexplode(c.relacl) AS a
WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p') AND a.grantee <> c.relowner
UNION
SELECT c.oid, CASE WHEN a.grantee = 0 THEN 'public' ELSE pg_get_userbyid(a.grantee)::text END,
       a.privilege_type
FROM pg_class c
JOIN pg_attribute col ON col.attrelid = c.oid AND col.attnum > 0 AND NOT col.attisdropped
CROSS JOIN LATERAL aclexplode(col.attacl) AS a
WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p') AND a.grantee <> c.relowner
ORDER BY 1, 2, 3
"""

# Roles named in a policy (except PUBLIC and the table's owner, whose
# owner-only policy exists because of FORCE ROW LEVEL SECURITY), and every
# role that inherits from them, that is a superuser or has BYPASSRLS: RLS
# does not apply to them, so a runtime or agent logging in as one is unscoped.
ELEVATED_MEMBERS: Final[LiteralString] = """
WITH RECURSIVE named (roleid) AS (
    SELECT DISTINCT u.role_oid
    FROM pg_policy p
    JOIN pg_class c ON c.oid = p.polrelid
    CROSS JOIN LATERAL unnest(p.polroles) AS u (role_oid)
    WHERE c.relnamespace = %s AND u.role_oid <> 0 AND u.role_oid <> c.relowner
), members (roleid, via) AS (
    SELECT roleid, roleid FROM named
    UNION
    SELECT m.member, members.via
    FROM pg_auth_members m JOIN members ON m.roleid = members.roleid
)
SELECT r.rolname::text, v.rolname::text, r.rolsuper, r.rolbypassrls
FROM members
JOIN pg_roles r ON r.oid = members.roleid
JOIN pg_roles v ON v.oid = members.via
WHERE r.rolsuper OR r.rolbypassrls
ORDER BY 1, 2
"""

ROUTINES: Final[LiteralString] = """
SELECT p.proname::text FROM pg_proc p WHERE p.pronamespace = %s ORDER BY 1
"""

# Citus: read only when the extension is installed (pg_dist_partition exists then).
CITUS: Final[LiteralString] = """
SELECT e.extversion FROM pg_catalog.pg_extension e WHERE e.extname = 'citus'
"""

CITUS_TABLES: Final[LiteralString] = """
SELECT p.logicalrelid::oid, p.partmethod::text,
       CASE WHEN p.partmethod = 'h' THEN column_to_column_name(p.logicalrelid, p.partkey) END,
       p.colocationid
FROM pg_dist_partition p
JOIN pg_catalog.pg_class c ON c.oid = p.logicalrelid
WHERE c.relnamespace = %s
"""
