-- SPDX-License-Identifier: MIT
-- mp.counter, mp.gauge and mp.histogram: a script's metrics, kept in the
-- memory every process of the server shares (src/core/metric.c), so an
-- update is one atomic operation and no message, and the status endpoint
-- (mp.http { status = }) and mp.metrics() show every worker's sum.
-- lx_metric_open (src/lx/lx_metric.c) fills core.metric and calls this
-- module's function with the mp table.
local core = require("moonport.core").metric
local family, series, add, set, observe, value =
  core.family, core.series, core.add, core.set, core.observe, core.value
local COUNTER, GAUGE, HISTOGRAM = core.COUNTER, core.GAUGE, core.HISTOGRAM
local type, error, tostring, setmetatable, getmetatable, pcall, concat =
  type, error, tostring, setmetatable, getmetatable, pcall, table.concat
local huge = math.huge

local NAME = "^[a-zA-Z_:][a-zA-Z0-9_:]*$"
local LABEL = "^[a-zA-Z_][a-zA-Z0-9_]*$"
-- Prometheus's default buckets (seconds)
local DEFAULT_BUCKETS = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 }

local function check_name(fn, name, help)
  if type(name) ~= "string" or not name:find(NAME) or #name > 95 then
    error(("bad argument #1 to '%s' (a metric name: letters, digits, _ and :, not starting with a digit; got %s)")
      :format(fn, tostring(name)), 4)
  end
  if name:sub(1, 9) == "moonport_" then
    error(("bad argument #1 to '%s' (names starting with moonport_ are the server's)"):format(fn), 4)
  end
  if help ~= nil and (type(help) ~= "string" or #help > 255) then
    error(("bad argument #2 to '%s' (help text expected: a string of at most 255 bytes)"):format(fn), 4)
  end
end

local function check_labels(fn, n, labels, histogram)
  if labels == nil then return {} end
  if type(labels) ~= "table" then
    error(("bad argument #%d to '%s' (a list of label names expected, got %s)"):format(n, fn, type(labels)), 4)
  end
  if #labels > 8 then error(("bad argument #%d to '%s' (at most 8 labels)"):format(n, fn), 4) end
  local out, seen = {}, {}
  for i = 1, #labels do
    local l = labels[i]
    if type(l) ~= "string" or not l:find(LABEL) or #l > 95 or l:sub(1, 2) == "__"
      or (histogram and l == "le") or seen[l] then
      error(("bad argument #%d to '%s' (label %d: a name of letters, digits and _, once each%s; got %s)")
        :format(n, fn, i, histogram and ", not le" or "", tostring(l)), 4)
    end
    seen[l] = true
    out[i] = l
  end
  return out
end

local Counter, Gauge, Histogram = {}, {}, {}
Counter.__index, Gauge.__index, Histogram.__index = Counter, Gauge, Histogram

-- The series of m for label values `lv` ({ name = value }), made on
-- first use and remembered by this lane; nil and a message when the
-- server has no room for it. Raises when a label is missing.
local function series_of(m, lv, fn)
  if m._s then return m._s end
  if type(lv) ~= "table" then
    error(("bad argument to '%s' (label values { %s = ... } expected, got %s)")
      :format(fn, m._labels[1], type(lv)), 3)
  end
  local labels, parts = m._labels, {}
  for i = 1, #labels do
    local v = lv[labels[i]]
    if v == nil then error(("'%s': %s needs a value for label %s"):format(fn, m.name, labels[i]), 3) end
    parts[i] = tostring(v)
  end
  local key = concat(parts, "\0") .. "\0"
  local s = m._cache[key]
  if s then return s end
  local err
  s, err = series(m._fam, key)
  if s then m._cache[key] = s end
  return s or -1, err
end

local function new(mt, kind, fn, name, help, labels, buckets)
  check_name(fn, name, help)
  labels = check_labels(fn, kind == HISTOGRAM and 4 or 3, labels, kind == HISTOGRAM)
  local ok, fam = pcall(family, kind, name, help or "", labels, buckets)
  if not ok then error(fn .. ": " .. tostring(fam), 3) end -- new, mp.x, caller
  local m = setmetatable({ name = name, _fam = fam, _labels = labels, _cache = {} }, mt)
  if #labels == 0 then m._s = series(fam, "") or -1 end
  return m
end

-- m:labels{ name = value }: the metric for those values, whose methods
-- take no labels (the series is looked up once).
local function labels_of(m, lv)
  if m._s then error(("'%s' has no labels"):format(m.name), 2) end
  local s, err = series_of(m, lv, "labels")
  return setmetatable({ name = m.name, _fam = m._fam, _s = s, _labels = {}, _err = err }, getmetatable(m))
end
Counter.labels, Gauge.labels, Histogram.labels = labels_of, labels_of, labels_of

local function number(fn, v, n)
  if v == nil then return 1 end
  if type(v) ~= "number" then
    error(("bad argument #%d to '%s' (number expected, got %s)"):format(n, fn, type(v)), 3)
  end
  return v
end

-- c:inc([n] [, labels]): adds n (default 1, never negative)
function Counter:inc(n, lv)
  if type(n) == "table" then n, lv = nil, n end
  n = number("inc", n, 1)
  if n < 0 or n ~= n then error("bad argument #1 to 'inc' (a counter only goes up)", 2) end
  add(series_of(self, lv, "inc"), n)
end

function Counter:value(lv) return value(series_of(self, lv, "value")) end
Gauge.value = Counter.value

function Gauge:inc(n, lv)
  if type(n) == "table" then n, lv = nil, n end
  add(series_of(self, lv, "inc"), number("inc", n, 1))
end

function Gauge:dec(n, lv)
  if type(n) == "table" then n, lv = nil, n end
  add(series_of(self, lv, "dec"), -number("dec", n, 1))
end

function Gauge:set(v, lv)
  if type(v) ~= "number" then error(("bad argument #1 to 'set' (number expected, got %s)"):format(type(v)), 2) end
  set(series_of(self, lv, "set"), v)
end

function Histogram:observe(v, lv)
  if type(v) ~= "number" then error(("bad argument #1 to 'observe' (number expected, got %s)"):format(type(v)), 2) end
  observe(series_of(self, lv, "observe"), v)
end

-- h:count([labels]): how many values were observed
function Histogram:count(lv) return value(series_of(self, lv, "count")) end

local function check_buckets(fn, b)
  if b == nil then return DEFAULT_BUCKETS end
  if type(b) ~= "table" or #b == 0 or #b > 32 then
    error(("bad argument #3 to '%s' (a list of 1 to 32 increasing bucket bounds expected)"):format(fn), 3)
  end
  local out = {}
  for i = 1, #b do
    local v = b[i]
    if type(v) ~= "number" or v ~= v or v == huge or v == -huge or (i > 1 and v <= out[i - 1]) then
      error(("bad argument #3 to '%s' (bucket %d: finite bounds in increasing order)"):format(fn, i), 3)
    end
    out[i] = v
  end
  return out
end

local M = {}

-- The router's latency histogram, by route pattern and status class,
-- registered on first use (lua/moonport/http.lua calls this for a request
-- the router matched).
local ROUTE_BUCKETS = { 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 }
local CLASSES = { "1xx", "2xx", "3xx", "4xx", "5xx" }
local route_fam, route_series = nil, {}
function M.route(route, status, seconds)
  if not route_fam then
    local ok, f = pcall(family, HISTOGRAM, "moonport_http_route_duration_seconds",
      "Time from the router's match to the response's end, by route pattern and status class.",
      { "route", "class" }, ROUTE_BUCKETS)
    if not ok then return end
    route_fam = f
  end
  local cls = CLASSES[(status - status % 100) / 100] or "5xx"
  local key = route .. "\0" .. cls .. "\0"
  local s = route_series[key]
  if not s then
    s = series(route_fam, key)
    if not s then return end -- no room: metric_dropped counts it
    route_series[key] = s
  end
  observe(s, seconds)
end

function M.install(mp)
  -- mp.counter(name, help [, labels])
  mp.counter = function(name, help, labels)
    local m = new(Counter, COUNTER, "mp.counter", name, help, labels)
    return m -- not a tail call: the errors' levels count this frame
  end
  -- mp.gauge(name, help [, labels])
  mp.gauge = function(name, help, labels)
    local m = new(Gauge, GAUGE, "mp.gauge", name, help, labels)
    return m
  end
  -- mp.histogram(name, help [, buckets [, labels]])
  mp.histogram = function(name, help, buckets, labels)
    local b = check_buckets("mp.histogram", buckets)
    local m = new(Histogram, HISTOGRAM, "mp.histogram", name, help, labels, b)
    return m
  end
end

return M
