-- Spec: mp.pg against a real PostgreSQL 15. Types both ways, errors with
-- SQLSTATE, transactions and savepoints, 1,000 concurrent requests on
-- -w 2 -t 2 with pool = 4 (pg_stat_activity, read with psql, never shows
-- more than 4 connections of a lane), a pool timeout, a query timeout
-- cancelled on the server while the lane serves, Postgres restarted under
-- load, sslmode=require, SCRAM, a slow DNS answer that delays only its
-- coroutine, and misuse that raises at the caller's line.
--
-- Postgres: the one .ci/run and `make test` start (scripts/pg-test-server,
-- MOONPORT_TEST_PG_* in the environment); without those variables the
-- spec starts its own for the file and stops it after. The servers run
-- spec/fixtures/pg_app.lua (POST /lua runs the body with `db` in scope);
-- the load comes from spec/node/pg_load.js (node's http).
local H = require "spec.helper"
local JS = require "spec.js"
local cjson = require "cjson"

local PSQL = "/usr/lib/postgresql/15/bin/psql"
local SCRIPT = H.root .. "/scripts/pg-test-server"
local PG = {}

local function start_pg()
  if os.getenv("MOONPORT_TEST_PG_PORT") then
    PG.port = tonumber(os.getenv("MOONPORT_TEST_PG_PORT"))
    PG.dir = os.getenv("MOONPORT_TEST_PG_DIR")
    PG.user = os.getenv("MOONPORT_TEST_PG_USER")
    PG.password = os.getenv("MOONPORT_TEST_PG_PASSWORD")
    PG.db = os.getenv("MOONPORT_TEST_PG_DB")
    PG.ca = os.getenv("MOONPORT_TEST_PG_CA")
    return
  end
  local st, out, err = H.exec({ "/bin/bash", SCRIPT, "start" }, { timeout = H.T(120) })
  assert(st == 0, "scripts/pg-test-server start failed: " .. tostring(out) .. tostring(err))
  local env = {}
  for k, v in out:gmatch("MOONPORT_TEST_PG_(%u+)=([^\n]*)") do env[k] = v end
  PG.port, PG.dir, PG.user = tonumber(env.PORT), env.DIR, env.USER
  PG.password, PG.db, PG.ca, PG.own = env.PASSWORD, env.DB, env.CA, true
end

local function stop_pg()
  if PG.own then H.exec({ "/bin/bash", SCRIPT, "stop", PG.dir }, { timeout = H.T(60) }) end
end

local function url(extra, pw)
  return ("postgres://%s:%s@127.0.0.1:%d/%s%s"):format(PG.user, pw or PG.password, PG.port,
    PG.db, extra or "")
end

-- psql as the superuser over the Unix socket: the server-side truth.
local function psql(sql)
  local st, out, err = H.exec({ PSQL, "-h", PG.dir, "-p", PG.port, "-U", "postgres",
    "-d", PG.db, "-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql })
  assert(st == 0, "psql failed: " .. tostring(err))
  return (out:gsub("\n$", ""))
end

local function post_lua(port, code, timeout)
  local c = H.connect(port)
  H.send(c, ("POST /lua HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s")
    :format(#code, code))
  local data = H.read_to_eof(c, timeout or H.T(20))
  c:close()
  assert(data, "no answer to /lua")
  local body = cjson.decode(data:match("\r\n\r\n(.*)$"))
  if body.raised then error("the script raised: " .. body.raised, 2) end
  return body.v
end

local start, cleanup = H.fixture_servers("pg_app.lua")

local ntag = 0
local function tag()
  ntag = ntag + 1
  return ("pgs%d_%d"):format(os.time() % 100000, ntag)
end

describe("mp.pg", function()
  setup(function()
    start_pg()
    psql("DROP TABLE IF EXISTS mp_t; CREATE TABLE mp_t (id int PRIMARY KEY, n int NOT NULL); " ..
      "INSERT INTO mp_t SELECT g, g * 10 FROM generate_series(1, 1000) g; ALTER TABLE mp_t OWNER TO " ..
      PG.user)
  end)
  teardown(stop_pg)
  after_each(cleanup)

  it("every type both ways, NULL as mp.null, int8 past 2^53 as a string", function()
    local _, port = start({ url() })
    local v = post_lua(port, [==[
      local null = mp.null
      local r = assert(db:query([=[
        SELECT 1::int2 AS i2, (-2147483648)::int4 AS i4, 9007199254740992::int8 AS i8,
          9007199254740993::int8 AS big, (-9223372036854775807 - 1)::int8 AS min8,
          1.5::float4 AS f4, -0.1::float8 AS f8, 'NaN'::float8 AS nan,
          123456789012345678901234567890.123::numeric AS num,
          true AS t, false AS f, 'héllo'::text AS txt, 'x'::varchar(3) AS vc,
          '\x00ff0001'::bytea AS bin, '{"a":[1,2,{"b":null}]}'::jsonb AS jb, '[1,"2"]'::json AS js,
          ARRAY[1, NULL, 3] AS ia, ARRAY['a,b', 'c"d', NULL, ''] AS ta, ARRAY[[1,2],[3,4]] AS nested,
          '{}'::int[] AS empty, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid AS id,
          '2024-02-29'::date AS d, '2024-02-29 12:34:56+00'::timestamptz AS ts, NULL::int AS nul,
          ''::text AS empty_s
      ]=]))
      local row = r[1]
      local hex = row.bin:gsub(".", function(c) return ("%02x"):format(c:byte()) end)
      -- parameters: nil, booleans, numbers, strings (one with zero bytes)
      local p = assert(db:query("SELECT $1::int IS NULL AS isnull, $2::bool AS b, $3::int8 AS n, " ..
        "$4::float8 AS x, $5::text AS s, length($6::bytea) AS blen, $6::bytea AS braw, $7::jsonb AS j, " ..
        "$8::int IS NULL AS mpnull",
        nil, true, 4503599627370496, 0.25, "O'Reilly; --", "a\0b\0\255", '{"k":1}', mp.null))[1]
      return {
        i2 = row.i2, i4 = row.i4, i8 = row.i8 == 2 ^ 53, big = row.big, min8 = row.min8, f4 = row.f4, f8 = row.f8,
        nan = row.nan ~= row.nan, num = row.num, t = row.t, f = row.f, txt = row.txt, vc = row.vc,
        hex = hex, binlen = #row.bin, jb = row.jb, js = row.js, ia_n = #row.ia, ia2_null = row.ia[2] == null,
        ia = { row.ia[1], row.ia[3] }, ta = { row.ta[1], row.ta[2], row.ta[3] == null, row.ta[4] },
        nested = row.nested, empty_n = #row.empty, empty_t = type(row.empty), id = row.id, d = row.d,
        ts = row.ts, nul = row.nul == null, cols = r.columns, affected = r.affected,
        empty_s = row.empty_s, only_empty = db:query("SELECT ''::text AS e")[1].e,
        p_isnull = p.isnull, p_b = p.b, p_n = p.n == 2 ^ 52, p_x = p.x, p_s = p.s, p_blen = p.blen,
        p_braw = p.braw == "a\0b\0\255", p_j = p.j, p_mpnull = p.mpnull,
      }
    ]==])
    assert.equal(1, v.i2)
    assert.equal(-2147483648, v.i4)
    assert.is_true(v.i8)
    assert.equal("9007199254740993", v.big)
    assert.equal("-9223372036854775808", v.min8)
    assert.equal(1.5, v.f4)
    assert.equal(-0.1, v.f8)
    assert.is_true(v.nan)
    assert.equal("123456789012345678901234567890.123", v.num)
    assert.is_true(v.t)
    assert.is_false(v.f)
    assert.equal("héllo", v.txt)
    assert.equal("x", v.vc)
    assert.equal("00ff0001", v.hex)
    assert.equal(4, v.binlen)
    assert.same({ a = { 1, 2, { b = cjson.null } } }, v.jb)
    assert.same({ 1, "2" }, v.js)
    assert.equal(3, v.ia_n)
    assert.is_true(v.ia2_null)
    assert.same({ 1, 3 }, v.ia)
    assert.same({ "a,b", 'c"d', true, "" }, v.ta)
    assert.same({ { 1, 2 }, { 3, 4 } }, v.nested)
    assert.equal(0, v.empty_n)
    assert.equal("table", v.empty_t)
    assert.equal("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", v.id)
    assert.equal("2024-02-29", v.d)
    assert.equal("2024-02-29 12:34:56+00", v.ts)
    assert.is_true(v.nul)
    assert.equal("", v.empty_s)
    assert.equal("", v.only_empty) -- a result whose only bytes are none
    assert.equal(25, #v.cols)
    assert.equal("i2", v.cols[1])
    assert.equal(1, v.affected)
    assert.is_true(v.p_isnull)
    assert.is_true(v.p_b)
    assert.is_true(v.p_n)
    assert.equal(0.25, v.p_x)
    assert.equal("O'Reilly; --", v.p_s)
    assert.equal(5, v.p_blen)
    assert.is_true(v.p_braw)
    assert.same({ k = 1 }, v.p_j)
    assert.is_true(v.p_mpnull)
  end)

  it("numbers as parameters and results keep their value (integers, -0, big, fractions)", function()
    local _, port = start({ url() })
    local v = post_lua(port, [[
      local r = assert(db:query("SELECT $1::int8 AS a, $2::int4 AS b, $3::float8::text AS c, " ..
        "$4::int8 AS d, $5::float8 AS e, $6::int8 AS f, $7::int2 AS g, $8::oid AS h, $9::int8::text AS i",
        -5, 0, -0.0, 2 ^ 55, 0.5, -9007199254740992, -32768, 4294967295,
        -123456789012345678))[1]
      -- compared here: the JSON answer would round the big ones
      return { r.a, r.b, r.c, r.d, r.e, r.f == -2 ^ 53, r.g, r.h, r.i }
    ]])
    -- -123456789012345678 is not a double: its nearest one goes, exactly
    assert.same({ -5, 0, "-0", "36028797018963968", 0.5, true, -32768, 4294967295,
      "-123456789012345680" }, v)
  end)

  it("errors carry SQLSTATE and the server's fields; the client goes on", function()
    local _, port = start({ url() })
    local t = tag()
    local v = post_lua(port, ([[
      assert(db:query("CREATE TABLE %s (id int PRIMARY KEY)"))
      assert(db:query("INSERT INTO %s VALUES ($1)", 1))
      local r1, e1, i1 = db:query("INSERT INTO %s VALUES ($1)", 1)
      local r2, e2, i2 = db:query("SELEC 1")
      local r3, e3, i3 = db:query("SELECT $1::int", "nope")
      local ok = db:query("SELECT count(*) AS n FROM %s")
      local r4 = db:query("DELETE FROM %s WHERE id = $1", 1)
      db:query("DROP TABLE %s")
      return { r1 == nil, e1, i1, r2 == nil, e2, i2, e3, i3.sqlstate, ok[1].n, r4.affected }
    ]]):format(t, t, t, t, t, t))
    assert.is_true(v[1])
    assert.matches("^ERROR 23505: duplicate key value violates unique constraint", v[2])
    assert.equal("23505", v[3].sqlstate)
    assert.equal(t .. "_pkey", v[3].constraint)
    assert.matches("already exists", v[3].detail)
    assert.is_true(v[4])
    assert.matches("^ERROR 42601: syntax error", v[5])
    assert.equal(1, v[6].position)
    assert.matches("^ERROR 22P02: invalid input syntax for type integer", v[7])
    assert.equal("22P02", v[8])
    assert.equal(1, v[9])
    assert.equal(1, v[10])
    -- /metrics counts them by SQLSTATE class
    local c = H.connect(port)
    H.send(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    local m = H.read_to_eof(c, H.T(10))
    c:close()
    local classes = {}
    for class, n in m:gmatch('\nmoonport_pg_sqlstate_errors_total{class="(%w+)"} (%d+)') do
      classes[class] = tonumber(n)
    end
    assert.same({ ["23"] = 1, ["42"] = 1, ["22"] = 1 }, classes, m)
    assert.equal("3", m:match("\nmoonport_pg_errors_total (%d+)"))
  end)

  it("misuse raises at the caller's line; a bad URL or option raises in mp.pg", function()
    local _, port = start({ url() })
    local v = post_lua(port, [[
      local out = {}
      local function try(f, ...) local ok, e = pcall(f, ...) out[#out + 1] = ok and "no error" or e end
      try(function() local r = db:query("SELECT $1", {}) return r end)
      try(function() local r = db:query(42) return r end)
      try(function() local r = db:query("SELECT $1", 1 / 0) return r end)
      try(mp.pg, "host=a,b dbname=x")
      try(mp.pg, "postgres://%zz")
      try(mp.pg, "postgres://x/y", { pool = 0 })
      try(mp.pg, "postgres://x/y", { bogus = 1 })
      try(mp.pg, "postgres://x/y", { timeout = -1 })
      try(function() return db:transaction("not a function") end)
      return out
    ]])
    assert.matches("^spec:3: pg: parameter %$1 is a table", v[1])
    assert.matches("^spec:4: pg: query needs an SQL string", v[2])
    assert.matches("^spec:5: pg: parameter %$1 is not a finite number", v[3])
    assert.matches("mp.pg: one host only", v[4])
    assert.matches("mp.pg: ", v[5])
    assert.matches("mp.pg: pool must be a whole number from 1", v[6])
    assert.matches("mp.pg: unknown option 'bogus'", v[7])
    assert.matches("mp.pg: timeout must be a number of milliseconds", v[8])
    assert.matches("function expected", v[9])
  end)

  it("transactions commit, roll back on a raise or nil, err; savepoints nest", function()
    local _, port = start({ url() })
    local t = tag()
    local v = post_lua(port, ([[
      assert(db:query("CREATE TABLE %s (id int PRIMARY KEY)"))
      local a = { db:transaction(function(tx)
        assert(tx:query("INSERT INTO %s VALUES (1)"))
        return "committed", 2
      end) }
      local ok, err = pcall(db.transaction, db, function(tx)
        tx:query("INSERT INTO %s VALUES (2)")
        error("boom")
      end)
      local n, ne = db:transaction(function(tx)
        tx:query("INSERT INTO %s VALUES (3)")
        return nil, "changed my mind"
      end)
      local x = { db:transaction(function(tx)
        tx:query("INSERT INTO %s VALUES (4)")
        local _, inner = tx:transaction(function(t2)
          t2:query("INSERT INTO %s VALUES (5)")
          return nil, "inner says no"
        end)
        local ok2, raised = pcall(tx.transaction, tx, function(t2)
          t2:query("INSERT INTO %s VALUES (6)")
          t2:transaction(function(t3) t3:query("INSERT INTO %s VALUES (7)") end)
          error("inner raise")
        end)
        tx:transaction(function(t2) t2:query("INSERT INTO %s VALUES (8)") end)
        -- an error inside a savepoint leaves the outer transaction usable
        tx:transaction(function(t2) return t2:query("INSERT INTO %s VALUES (4)") end)
        return inner, raised
      end) }
      local rows = db:query("SELECT array_agg(id ORDER BY id) AS ids FROM %s")
      db:query("DROP TABLE %s")
      -- a tx kept past its end, its client dropped and collected
      local kept
      local other = mp.pg(db_url)
      other:transaction(function(tx) kept = tx end)
      other = nil
      collectgarbage() collectgarbage()
      local _, kerr = kept:query("SELECT 1")
      kept = nil
      collectgarbage() collectgarbage()
      return { a = a, ok = ok, err = err, n = n, ne = ne, x = x, ids = rows[1].ids, kerr = kerr }
    ]]):gsub("%%s", t):gsub("db_url", ("%q"):format(url())), nil)
    assert.same({ "committed", 2 }, v.a)
    assert.is_false(v.ok)
    assert.matches("boom", v.err)
    assert.equal(nil, v.n)
    assert.equal("changed my mind", v.ne)
    assert.equal("inner says no", v.x[1])
    assert.matches("inner raise", v.x[2])
    assert.same({ 1, 4, 8 }, v.ids)
    assert.equal("transaction is over", v.kerr)
  end)

  it("db:pipeline: one round trip, one implicit transaction; an error aborts what follows and says so", function()
    local _, port = start({ url() })
    local t = tag()
    local v = post_lua(port, ([[
      assert(db:query("CREATE TABLE %s (id int PRIMARY KEY)"))
      local a = db:pipeline { { "SELECT $1::int AS x", 1 }, { "SELECT 2 AS y" }, { "SELECT $1::text || $2 AS z", "a", "b" } }
      local b = db:pipeline { { "INSERT INTO %s VALUES ($1)", 1 }, { "SELECT 1/0" }, { "INSERT INTO %s VALUES (2)" } }
      local n = db:query("SELECT count(*) AS n FROM %s")[1].n
      local c = db:pipeline({ timeout = 200 }, { { "SELECT pg_sleep(5)" }, { "SELECT 1 AS q" } })
      local after = db:query("SELECT 5 AS f")[1].f
      db:query("DROP TABLE %s")
      return { a[1][1].x, a[2][1].y, a[3][1].z, b[1].affected, b[2].err, b[2].sqlstate, b[3].err, n,
        c[1].err, c[2].err, after }
    ]]):gsub("%%s", t), nil)
    assert.same({ 1, 2, "ab", 1 }, { v[1], v[2], v[3], v[4] })
    assert.equal("ERROR 22012: division by zero", v[5])
    assert.equal("22012", v[6])
    assert.equal("aborted: an earlier statement of the pipeline failed", v[7])
    assert.equal(0, v[8]) -- the INSERT before the error was rolled back with it
    assert.equal("timeout", v[9])
    assert.equal("timeout", v[10])
    assert.equal(5, v[11])
  end)

  it("COPY of 1 M rows both ways without the worker's memory growing (a bad row: its SQLSTATE)", function()
    local _, port = start({ url() }, { threads = 1 })
    local t = tag()
    local N = H.sanitized and 100000 or 1000000
    local v = post_lua(port, ([[
      local function hwm()
        local f = io.open("/proc/self/status")
        local kb = tonumber(f:read("*a"):match("VmHWM:%%s*(%%d+)"))
        f:close()
        return kb
      end
      assert(db:query("CREATE TABLE %s (id int, s text)"))
      collectgarbage()
      local before = hwm()
      local i, N = 0, %d
      local n, err = db:copy_in("COPY %s FROM STDIN", function()
        if i >= N then return nil end
        local b = {}
        for k = 1, 1000 do i = i + 1 b[k] = i .. "\trow " .. i .. "\n" end
        return table.concat(b)
      end)
      local rows, bytes, sum, last = 0, 0, 0, nil
      local m, err2 = db:copy_out("COPY %s TO STDOUT", function(chunk)
        bytes = bytes + #chunk
        for id in chunk:gmatch("(%%d+)\t[^\n]*\n") do rows = rows + 1 sum = sum + tonumber(id) end
      end)
      local after = hwm()
      local once = false
      local bad, berr, binfo = db:copy_in("COPY %s FROM STDIN", function()
        if once then return nil end
        once = true
        return "x\ty\n"
      end)
      local cnt = db:query("SELECT count(*) AS n FROM %s")[1].n
      local wrong, werr = db:copy_in("COPY %s TO STDOUT", function() return nil end)
      local still = db:query("SELECT 1 AS x")[1].x
      db:query("DROP TABLE %s")
      return { n = n, err = err, m = m, err2 = err2, rows = rows, bytes = bytes, sum = sum,
        grew_kb = after - before, bad = bad, berr = berr, bstate = binfo and binfo.sqlstate, cnt = cnt,
        werr = werr, still = still }
    ]]):format(t, N, t, t, t, t, t, t), H.T(120))
    assert.equal(N, v.n)
    assert.equal(N, v.m)
    assert.equal(N, v.rows)
    assert.equal(N * (N + 1) / 2, v.sum)
    assert.equal(N, v.cnt) -- the bad COPY added nothing
    assert.matches("^ERROR 22P02: invalid input syntax for type integer", v.berr)
    assert.equal("22P02", v.bstate)
    assert.matches("not a COPY FROM STDIN", v.werr)
    assert.equal(1, v.still)
    -- the rows went through in chunks: the worker's peak grew by far less
    -- than the data (about 17 MB of text for 1 M rows)
    if not H.sanitized then -- (a sanitizer's RSS says nothing of live memory)
      assert.is_true(v.grew_kb < 8 * 1024, "the worker's peak memory grew by " .. v.grew_kb .. " KiB")
    end
  end)

  it("a result past max_result fails with a clear error, and the connection goes on", function()
    local _, port = start({ url(), '{"max_result":65536,"pool":1}' })
    local v = post_lua(port, [[
      local a, ea = db:query("SELECT repeat('x', 100000) AS big")
      local b, eb = db:query("SELECT g, repeat('y', 100) AS s FROM generate_series(1, 5000) g")
      local c = db:query("SELECT g FROM generate_series(1, 100) g")
      return { a == nil, ea, b == nil, eb, #c, db:stats().size }
    ]])
    assert.is_true(v[1])
    assert.equal("result larger than max_result (65536 bytes)", v[2])
    assert.is_true(v[3])
    assert.equal("result larger than max_result (65536 bytes)", v[4])
    assert.equal(100, v[5])
    assert.equal(1, v[6]) -- the same connection served all three
  end)

  it("1,000 concurrent requests on -w 2 -t 2 with pool = 4: never more than 4 connections a lane", function()
    if JS.missing() then pending(JS.missing()) return end
    local t = tag()
    local srv, port = start({ url(), '{"pool":4}', t }, { workers = 2, threads = 2 })
    local load = H.spawn({ JS.node, JS.dir .. "/pg_load.js", tostring(port), "1000" })
    load.sanitizer_checked = true
    local most, seen = 0, 0
    H.wait_for(function()
      local out = psql(("SELECT application_name, count(*) FROM pg_stat_activity " ..
        "WHERE application_name LIKE '%s-%%' GROUP BY 1"):format(t))
      for _, line in ipairs(H.lines(out)) do
        local n = tonumber(line:match("|(%d+)$"))
        if n then
          seen = seen + 1
          if n > most then most = n end
        end
      end
      return not load:alive()
    end, H.T(60), "the load")
    local rows = JS.exec("pg_load.js", { port, 1 }) -- after the load: still serving
    assert.equal(1, rows[1].ok)
    local res = cjson.decode(load:stdout():match("^(.-)\n"))
    assert.equal(1000, res.ok, table.concat(res.errors, "\n"))
    assert.equal(0, res.fail)
    assert.is_true(seen > 0, "pg_stat_activity never showed the lanes' connections")
    assert.is_true(most <= 4, "a lane had " .. most .. " connections")
    -- every lane's pool: at most 4, whatever psql happened to see
    local lanes = psql(("SELECT count(DISTINCT application_name) FROM pg_stat_activity " ..
      "WHERE application_name LIKE '%s-%%'"):format(t))
    assert.is_true(tonumber(lanes) <= 4)
    assert.equal(0, srv:stop())
  end)

  it("a pool timeout: a query waits no longer than pool_timeout for a busy pool", function()
    local _, port = start({ url(), ('{"pool":1,"pool_timeout":300,"connect_timeout":%d}'):format(
      math.floor(H.T(10) * 1000)) })
    local v = post_lua(port, [[
      -- the connection first (a slow connect would spend the 300 ms)
      while not db:query("SELECT 0") do mp.sleep(0.05) end
      local t = mp.spawn(function()
        return db:transaction(function(tx) return tx:query("SELECT pg_sleep(1.5)") and "held" end)
      end)
      while db:stats().busy < 1 and t:status() == "running" do mp.sleep(0.01) end
      local t0 = mp.now()
      local r, err = db:query("SELECT 1 AS x")
      local waited = mp.now() - t0
      local held = mp.join(t)[1]
      local again = db:query("SELECT 2 AS x")
      return { r == nil, err, waited, held, again[1].x }
    ]])
    assert.is_true(v[1], cjson.encode(v))
    assert.equal("pool timeout", v[2])
    assert.is_true(v[3] >= 290 and v[3] < H.T(1.4) * 1000, tostring(v[3]))
    assert.equal("held", v[4])
    assert.equal(2, v[5])
    -- /metrics has the pool's figures
    local c = H.connect(port)
    H.send(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    local m = H.read_to_eof(c, H.T(10))
    c:close()
    local function metric(name) return tonumber(m:match("\n" .. name .. " (%S+)")) end
    assert.is_true(metric("moonport_pg_queries_total") >= 3, m)
    assert.is_true(metric("moonport_pg_timeouts_total") >= 1, m)
    assert.equal(1, metric("moonport_pg_connections"))
    assert.equal(0, metric("moonport_pg_waiting"))
    assert.equal(0, metric("moonport_pg_connections_busy"))
    assert.is_true(metric("moonport_pg_query_seconds_total") >= 1.4, m) -- the pg_sleep(1.5)
  end)

  it("a query timeout answers at once and is cancelled on the server while the lane serves", function()
    local _, port = start({ url() }, { threads = 1 })
    local t = tag()
    local ms = math.floor(H.T(1) * 1000)
    local c = H.connect(port)
    local code = ("local t0 = mp.now() local r, e = db:query({ timeout = %d }, 'SELECT pg_sleep(60) AS %s') " ..
      "return { r == nil, e, mp.now() - t0 }"):format(ms, t)
    H.send(c, ("POST /lua HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"):format(#code, code))
    local function active()
      return psql(("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%%AS %s' AND state = 'active'"):format(t))
    end
    -- while it runs, the lane answers others
    assert.equal("pong", post_lua(port, "return 'pong'"))
    local data = H.read_to_eof(c, H.T(20))
    local v = cjson.decode(data:match("\r\n\r\n(.*)$")).v
    assert.is_true(v[1])
    assert.equal("timeout", v[2])
    assert.is_true(v[3] >= ms - 5, tostring(v[3]))
    -- cancelled on the server: gone long before its 60 s, and Postgres
    -- says why in its log
    H.wait_for(function() return active() == "0" end, H.T(10), "the cancel")
    if PG.dir and H.exists(PG.dir .. "/server.log") then
      H.wait_for(function()
        local log = H.read_file(PG.dir .. "/server.log") or ""
        -- (the ERROR line and its STATEMENT line, which names our query)
        local at = log:find("STATEMENT:%s+SELECT pg_sleep%(60%) AS " .. t)
        return at ~= nil and log:sub(1, at):find("canceling statement due to user request[^\n]*\n[^\n]*$") ~= nil
      end, H.T(10), "the cancel in Postgres's log")
    end
    assert.equal(1, post_lua(port, "return db:query('SELECT 1 AS x')[1].x"))
  end)

  it("Postgres restarted under load: the queries in flight fail, the next ones succeed", function()
    if JS.missing() then pending(JS.missing()) return end
    if not PG.dir then pending("needs MOONPORT_TEST_PG_DIR to restart the server") return end
    local _, port = start({ url(), '{"pool":2}' }, { threads = 1 })
    local load = H.spawn({ JS.node, JS.dir .. "/pg_load.js", tostring(port), "200", "/sleep" })
    load.sanitizer_checked = true
    H.wait_for(function()
      return tonumber(psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%' " ..
        "AND state = 'active'")) > 0
    end, H.T(10), "queries running")
    local st = H.exec({ "/bin/bash", SCRIPT, "restart", PG.dir }, { timeout = H.T(60) })
    assert.equal(0, st)
    H.wait_for(function() return not load:alive() end, H.T(60), "the load to end")
    local res = cjson.decode(load:stdout():match("^(.-)\n"))
    assert.equal(200, res.ok + res.fail)
    assert.equal(200, res.ok, table.concat(res.errors, "\n")) -- every one answered (ok or err)
    -- the next queries succeed on new connections
    H.wait_for(function()
      local ok, v = pcall(post_lua, port, "local r = db:query('SELECT 1 AS x') return r and r[1].x")
      return ok and v == 1
    end, H.T(20), "a query after the restart")
    local v = post_lua(port, "return db:stats()")
    assert.is_true(v.errors > 0, "no query in flight failed")
  end)

  it("TLS (sslmode=require and verify-full) and SCRAM; a wrong password is a clear error", function()
    local _, port = start({ url() })
    local v = post_lua(port, ([[
      local a = mp.pg(%q)
      local b = mp.pg(%q)
      local c = mp.pg(%q)
      local ra = a:query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
      local rb = b:query("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
      local rc, ec = c:query("SELECT 1")
      local auth = db:query("SELECT rolpassword LIKE 'SCRAM-SHA-256$%%' AS scram FROM pg_authid WHERE rolname = current_user")
      return { ra[1].ssl, rb[1].ssl, rb[1].version, rc == nil, ec }
    ]]):format(url("?sslmode=require"), url("?sslmode=verify-full&sslrootcert=" .. PG.ca),
      url("?sslmode=disable", "wrong")))
    assert.is_true(v[1])
    assert.is_true(v[2])
    assert.matches("^TLSv1", v[3])
    assert.is_true(v[4])
    assert.matches("^connect: .*password authentication failed", v[5])
  end)

  it("a slow DNS answer delays only its coroutine, not the lane", function()
    local stub = H.spawn({ "/usr/bin/python3", H.fixture("dns_stub.py") })
    local dport = stub:wait_stdout("ready (%d+)", H.T(5))
    local _, port = start({ url() }, { threads = 1, env = { MOONPORT_DNS_SERVERS = "127.0.0.1:" .. dport } })
    local c = H.connect(port)
    local code = ("local s = mp.pg(%q) local t0 = mp.now() local r, e = s:query('SELECT 1') " ..
      "return { e, mp.now() - t0 }"):format(("postgres://%s:%s@slow.test:%d/%s"):format(PG.user,
      PG.password, PG.port, PG.db))
    H.send(c, ("POST /lua HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"):format(#code, code))
    local t0 = H.now()
    assert.equal(1, post_lua(port, "return db:query('SELECT 1 AS x')[1].x"))
    assert.is_true(H.now() - t0 < 0.9, "the lane waited for the lookup")
    local data = H.read_to_eof(c, H.T(15))
    local v = cjson.decode(data:match("\r\n\r\n(.*)$")).v
    -- slow.test is 127.0.0.2 after 1 s, where nothing listens
    assert.matches("^connect: ", v[1])
    assert.is_true(v[2] >= 900, tostring(v[2]))
    stub:kill()
  end)

  it("LISTEN/NOTIFY with -w 4: one LISTEN connection, each notification once to every WebSocket", function()
    if JS.missing() then pending(JS.missing()) return end
    local t = tag()
    local srv, port = start({ url(), ('{"listen":"%s"}'):format(t), t }, { workers = 4, threads = 1 })
    local clients = H.sanitized and 20 or 100
    local ws = H.spawn({ JS.node, JS.dir .. "/pg_ws.js", tostring(port), tostring(clients) })
    ws.sanitizer_checked = true
    H.wait_for(function() return ws:stdout():find('"ready":true', 1, true) ~= nil end, H.T(20),
      "the WebSocket clients")
    -- the one LISTEN connection is up (the root's)
    H.wait_for(function()
      return psql(("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%s-%%' " ..
        "AND query LIKE 'LISTEN%%'"):format(t)) == "1"
    end, H.T(10), "the LISTEN connection")
    local sql = {}
    for i = 1, 20 do sql[#sql + 1] = ("NOTIFY \"%s\", '%d';"):format(t, i) end
    sql[#sql + 1] = ("NOTIFY \"%s\", 'end';"):format(t)
    psql(table.concat(sql, " "))
    H.wait_for(function() return not ws:alive() end, H.T(20), "every client's 'end'")
    local res = cjson.decode(ws:stdout():match('({"clients".-})\n'))
    assert.equal(clients, res.clients)
    for i = 1, 20 do assert.same({ 1, 1 }, res.per[tostring(i)], "notification " .. i) end
    assert.same({ 1, 1 }, res.per["end"])
    assert.is_true(res.order_ok)
    assert.equal("1", psql(("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%s-%%' " ..
      "AND query LIKE 'LISTEN%%'"):format(t)))
    assert.equal(0, srv:stop())
  end)

  it("a connection carries at most 128 queries in flight; the rest wait in the pool's queue", function()
    local _, port = start({ url(), '{"pool":1}' })
    local v = post_lua(port, [[
      local limit = mp.now() + 15000 * (tonumber(os.getenv("MOONPORT_TEST_SCALE")) or 1)
      local function until_(f) while not f() and mp.now() < limit do mp.sleep(5) end return f() end
      while not db:query("SELECT 0") do mp.sleep(50) end
      -- another client holds a lock that the first query waits for, so
      -- nothing behind it on the connection can finish
      local holder, locked, go = mp.pg(mp.args[2], { pool = 1 }), false, false
      local h = mp.spawn(function()
        return holder:transaction(function(tx)
          assert(tx:query("SELECT pg_advisory_xact_lock(4242)"))
          locked = true
          until_(function() return go end)
          return "held"
        end)
      end)
      until_(function() return locked end)
      local tasks = { mp.spawn(function()
        return db:query("SELECT pg_advisory_xact_lock_shared(4242)") and -1
      end) }
      until_(function() return db:stats().busy == 1 end)
      for i = 1, 299 do
        tasks[#tasks + 1] = mp.spawn(function()
          local r, err = db:query("SELECT $1::int AS i", i)
          return r and r[1].i or err
        end)
      end
      -- 128 on the wire (the blocked one first), 172 in the queue
      until_(function() return db:stats().waiting == 172 end)
      local st = db:stats()
      go = true
      local held = mp.join(h)[1]
      local rs = mp.join(tasks)
      local ok = rs[1][1] == -1
      for i = 2, 300 do ok = ok and rs[i][1] == i - 1 end
      return { waiting = st.waiting, busy = st.busy, size = st.size, held = held, ok = ok,
        after = db:stats().waiting }
    ]], H.T(40))
    assert.equal(172, v.waiting, cjson.encode(v))
    assert.equal(1, v.busy)
    assert.equal(1, v.size)
    assert.equal("held", v.held)
    assert.is_true(v.ok)
    assert.equal(0, v.after)
  end)

  it("the statement cache keeps statement_cache statements a connection, evicting the oldest", function()
    local _, port = start({ url(), '{"pool":1,"statement_cache":2}' })
    local v = post_lua(port, [[
      local function prepared()
        return db:query("SELECT count(*)::int AS n FROM pg_prepared_statements")[1].n
      end
      local seen, ok = {}, true
      for round = 1, 3 do -- one at a time: 5 statements through 2 slots
        for k = 1, 5 do
          local r = db:query("SELECT $1::int + " .. k .. " AS v", round * 10)
          ok = ok and r and r[1].v == round * 10 + k
        end
        seen[#seen + 1] = prepared()
      end
      -- many at once: evictions while the evicted statement is still in
      -- flight, and prepares that fail (a syntax error, a bad parameter)
      local tasks = {}
      for i = 1, 200 do
        tasks[i] = mp.spawn(function()
          local k = i % 7
          if k == 5 then return db:query("SELECT $1::int +", i) == nil end
          if k == 6 then return db:query("SELECT $1::int AS v", "x" .. i) == nil end
          local r = db:query("SELECT $1::int + " .. k .. " AS v", i)
          return r ~= nil and r[1].v == i + k
        end)
      end
      local all = true
      for _, r in ipairs(mp.join(tasks)) do all = all and r[1] == true end
      seen[#seen + 1] = prepared()
      return { ok = ok, all = all, seen = seen, size = db:stats().size }
    ]])
    assert.is_true(v.ok)
    assert.is_true(v.all)
    assert.same({ 2, 2, 2, 2 }, v.seen)
    assert.equal(1, v.size)
  end)

  it("a statement the server dropped or changed is prepared again (schema change, DISCARD ALL)", function()
    psql("DROP TABLE IF EXISTS mp_rp; CREATE TABLE mp_rp (id int PRIMARY KEY, a int); " ..
      "INSERT INTO mp_rp VALUES (1, 10); ALTER TABLE mp_rp OWNER TO " .. PG.user)
    local _, port = start({ url(), '{"pool":1}' })
    local v = post_lua(port, [==[
      local q = "SELECT * FROM mp_rp WHERE id = $1"
      local out = {}
      local function cols(r, err)
        if not r then return err end
        return r.columns and table.concat(r.columns, ",") or r.sqlstate .. " " .. r.err
      end
      out.first = cols(db:query(q, 1))
      -- the result type changes: "cached plan must not change result type", retried once
      assert(db:query("ALTER TABLE mp_rp ADD COLUMN b int DEFAULT 7"))
      out.altered = cols(db:query(q, 1))
      -- many in flight on the stale statement at once: each is retried
      assert(db:query("ALTER TABLE mp_rp ADD COLUMN c int DEFAULT 8"))
      local tasks = {}
      for i = 1, 20 do tasks[i] = mp.spawn(function() return cols(db:query(q, 1)) end) end
      out.many = {}
      for _, r in ipairs(mp.join(tasks)) do out.many[r[1]] = (out.many[r[1]] or 0) + 1 end
      -- a pipeline is one transaction, not retried: its statement fails
      -- once, and the next pipeline prepares it afresh
      assert(db:query("ALTER TABLE mp_rp ADD COLUMN d int DEFAULT 9"))
      local p1 = db:pipeline { { q, 1 } }
      out.pipe_err = p1[1].sqlstate
      out.pipe_again = cols(db:pipeline { { q, 1 } }[1])
      -- the server forgets every statement: the cache follows
      assert(db:query("DISCARD ALL"))
      out.discard = cols(db:query(q, 1))
      out.discard_pipe = cols(db:pipeline { { "SELECT $1::int AS x", 5 } }[1])
      assert(db:query("DEALLOCATE ALL"))
      out.dealloc = cols(db:query(q, 1))
      out.dealloc_pipe = cols(db:pipeline { { "SELECT $1::int AS x", 5 } }[1])
      out.prepared = db:query("SELECT count(*)::int AS n FROM pg_prepared_statements")[1].n
      out.size = db:stats().size
      return out
    ]==])
    assert.equal("id,a", v.first)
    assert.equal("id,a,b", v.altered)
    assert.same({ ["id,a,b,c"] = 20 }, v.many)
    assert.equal("0A000", v.pipe_err)
    assert.equal("id,a,b,c,d", v.pipe_again)
    assert.equal("id,a,b,c,d", v.discard)
    assert.equal("x", v.discard_pipe)
    assert.equal("id,a,b,c,d", v.dealloc)
    assert.equal("x", v.dealloc_pipe)
    assert.equal(2, v.prepared) -- q and the pipeline's, nothing left behind
    assert.equal(1, v.size)
  end)

  it("a NOTIFY flood past the 10,000 queue bound with a slow callback: none lost, in order", function()
    -- The callback runs on the lane that reads the LISTEN socket, so while
    -- it works nothing more is read: the flood waits in TCP and in
    -- Postgres's queue, and what moonport holds stays under PG_NOTES_MAX.
    local srv, port = start({ url() }, { threads = 1 })
    local n = H.sanitized and 12000 or 30000
    local v = post_lua(port, ([[
      local N, ch = %d, "mp_flood"
      local limit = mp.now() + 60000 * (tonumber(os.getenv("MOONPORT_TEST_SCALE")) or 1)
      local got, pinged, inorder, spin = 0, false, true, 0
      assert(db:listen(ch, function(payload)
        if payload == "ping" then pinged = true return end
        got = got + 1
        if tonumber(payload) ~= got then inorder = false end
        for j = 1, 20000 do spin = spin + j %% 7 end -- slower than the server sends
      end))
      local other = mp.pg(mp.args[2], { pool = 1 })
      while not pinged and mp.now() < limit do -- the LISTEN is up
        other:query("SELECT pg_notify($1, 'ping')", ch)
        mp.sleep(50)
      end
      assert(other:query("SELECT count(pg_notify($1, g::text)) FROM generate_series(1, $2::int) g",
        ch, N))
      while got < N and mp.now() < limit do mp.sleep(10) end
      return { got = got, inorder = inorder, spin = spin > 0 }
    ]]):format(n), H.T(90))
    assert.equal(n, v.got)
    assert.is_true(v.inorder)
    assert.is_nil(srv:stderr():find("dropped", 1, true), srv:stderr())
  end)
end)
