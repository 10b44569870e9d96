/* Unit tests for src/cluster/glob.h: pub/sub channel patterns. Own main();
 * checks from check.h. */
#include "cluster/glob.h"

#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static bool m(const char *pat, const char *str) {
  return glob_match(pat, strlen(pat), str, strlen(str));
}

static void test_cases(void) {
  CHECK(m("chat", "chat"));
  CHECK(!m("chat", "chats"));
  CHECK(!m("chats", "chat"));
  CHECK(m("", ""));
  CHECK(!m("", "a"));
  CHECK(m("*", ""));
  CHECK(m("*", "anything at all"));
  CHECK(m("chat.*", "chat.lobby"));
  CHECK(m("chat.*", "chat."));
  CHECK(!m("chat.*", "chat"));
  CHECK(m("*.lobby", "chat.lobby"));
  CHECK(m("c*t*y", "chat.lobby"));
  CHECK(!m("c*t*z", "chat.lobby"));
  CHECK(m("a*b*c", "aXbYbZc"));
  CHECK(m("**a", "bba"));
  CHECK(m("user.?", "user.1"));
  CHECK(!m("user.?", "user.10"));
  CHECK(!m("user.?", "user."));
  CHECK(m("[abc]*", "bob"));
  CHECK(!m("[abc]*", "dan"));
  CHECK(m("[^abc]*", "dan"));
  CHECK(!m("[^abc]*", "bob"));
  CHECK(m("x[a-c]y", "xby"));
  CHECK(m("x[c-a]y", "xby")); /* a reversed range still counts */
  CHECK(!m("x[a-c]y", "xdy"));
  CHECK(m("x[\\]]y", "x]y"));
  CHECK(m("x[a\\-c]y", "x-y"));
  CHECK(!m("x[a\\-c]y", "xby"));
  CHECK(m("a\\*b", "a*b"));
  CHECK(!m("a\\*b", "axb"));
  CHECK(m("a\\?", "a?"));
  CHECK(!m("a\\?", "ab"));
  CHECK(m("a\\", "a\\")); /* a trailing backslash is itself */
  CHECK(m("[abc", "b"));  /* an unclosed class runs to the end */
  /* Binary-safe: NUL bytes inside. */
  CHECK(glob_match("a\0*", 3, "a\0bc", 4));
  CHECK(!glob_match("a\0b", 3, "a\0c", 3));
  CHECK(glob_match("?", 1, "\0", 1));
  CHECK(glob_match("[\x80-\xff]", 5, "\xc3", 1));

  CHECK(glob_is_pattern("chat.*", 6));
  CHECK(glob_is_pattern("a?", 2));
  CHECK(glob_is_pattern("[x]", 3));
  CHECK(glob_is_pattern("a\\b", 3));
  CHECK(!glob_is_pattern("chat.lobby", 10));
}

/* Against the C library's fnmatch on patterns without brackets (where the
 * two mean the same): random patterns over a small alphabet. */
static void test_against_fnmatch(void) {
  static const char pchars[] = "ab*?\\";
  static const char schars[] = "ab*?\\";
  char pat[9], str[9];
  unsigned seed = 12345;
  int disagree = 0;
  for (int round = 0; round < 200000; round++) {
    size_t pl = (size_t)(rand_r(&seed) % 8), sl = (size_t)(rand_r(&seed) % 8);
    for (size_t i = 0; i < pl; i++) pat[i] = pchars[rand_r(&seed) % 5];
    for (size_t i = 0; i < sl; i++) str[i] = schars[rand_r(&seed) % 5];
    pat[pl] = str[sl] = 0;
    /* A lone trailing backslash is a literal for us (as for Redis) and an
     * error for fnmatch: leave those out. */
    size_t bs = 0;
    while (bs < pl && pat[pl - 1 - bs] == '\\') bs++;
    if (bs % 2) continue;
    bool ours = glob_match(pat, pl, str, sl);
    bool libc = fnmatch(pat, str, 0) == 0;
    if (ours != libc && disagree++ < 5)
      printf("glob and fnmatch disagree: pattern '%s' string '%s': %d vs %d\n",
             pat, str, ours, libc);
  }
  CHECK_EQ(disagree, 0);
}

int main(void) {
  test_cases();
  test_against_fnmatch();
  return check_summary();
}
