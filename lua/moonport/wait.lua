-- SPDX-License-Identifier: MIT
-- The waiting functions of the C API (mp.sleep, req:read, ...): a check of
-- the arguments, then a yield to the lane's runner with the token that
-- tells it "arm this wait" (src/lx/lx_lane.c, lx_push_waiter).
--
-- The yield is the raw coroutine.yield (the scripts' one refuses to leave a
-- callback suspended); `arm` is the C function, as a light userdata, that
-- the runner calls to arm the event and its cleanup.
local core = require("moonport.core")
local yield, TOKEN = core.raw_yield, core.wait_token

return function(check, arm)
  return function(...)
    check(...)
    return yield(TOKEN, arm, ...)
  end
end
