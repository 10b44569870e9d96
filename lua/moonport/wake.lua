-- SPDX-License-Identifier: MIT
-- mp.wait(fn [, timeout_ms]): the bridge from a callback API to a waiting
-- coroutine. fn(wake) starts something that later calls wake(...); mp.wait
-- returns what wake got, or nil and "timeout" after timeout_ms (none when
-- nil or 0). A wake after the timeout, or a second one, does nothing and
-- returns false. An error in fn is raised from mp.wait. The latch and its
-- timer are src/lx/lx_wait.c.
local core = require("moonport.core")
local C = core.wake -- new, fire, check, arm: filled by lx_wait_open
local new, fire, check, arm = C.new, C.fire, C.check, C.arm
local yield, TOKEN = core.raw_yield, core.wait_token
local select, type, unpack, error = select, type, unpack, error

return function(fn, ms)
  if type(fn) ~= "function" then
    error("mp.wait: fn must be a function", 2)
  end
  if ms ~= nil and (type(ms) ~= "number" or ms < 0 or ms > 2147483647) then
    error("mp.wait: timeout_ms must be a number of ms >= 0", 2)
  end
  check()
  local w = new()
  local got, n
  local function wake(...)
    if not fire(w) then return false end
    got, n = { ... }, select("#", ...)
    return true
  end
  fn(wake)
  if got then return unpack(got, 1, n) end -- woken before we waited
  local ok, err = yield(TOKEN, arm, w, ms or 0)
  if not ok then return nil, err end
  return unpack(got, 1, n)
end
