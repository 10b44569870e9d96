/* SPDX-License-Identifier: MIT */

/* Unit tests for redis_url_parse (src/redis/redis.h): redis:// as before,
 * rediss:// with its TLS query parameters and their limits, and
 * unix:///path. Own
 * main(); checks from check.h. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "redis/redis.h"

static int parse(const char *s, redis_url_t *u, char *err) {
  return redis_url_parse(s, u, err, 256);
}

static void test_plain(void) {
  redis_url_t u;
  char err[256];
  CHECK_EQ(parse("redis://h:7000/3", &u, err), 0);
  CHECK(!strcmp(u.host, "h"));
  CHECK_EQ(u.port, 7000);
  CHECK_EQ(u.db, 3);
  CHECK(!u.tls);
  CHECK_EQ(parse("redis://:p%40ss@h", &u, err), 0);
  CHECK(!strcmp(u.password, "p@ss"));
  CHECK_EQ(parse("http://h", &u, err), -1);
  CHECK(strstr(err, "is not a redis://, rediss:// or unix:// URL") != NULL);
}

static void test_unix(void) {
  redis_url_t u;
  char err[256], where[300];
  CHECK_EQ(parse("unix:///run/redis/redis.sock", &u, err), 0);
  CHECK(!strcmp(u.path, "/run/redis/redis.sock"));
  CHECK(!u.tls);
  CHECK_EQ(u.db, 0);
  CHECK(!strcmp(redis_url_where(&u, where, sizeof(where)),
                "unix:/run/redis/redis.sock"));
  CHECK_EQ(parse("unix://:s%3Fcret@/tmp/r.sock?db=4", &u, err), 0);
  CHECK(!strcmp(u.path, "/tmp/r.sock"));
  CHECK(!strcmp(u.password, "s?cret"));
  CHECK_EQ(u.db, 4);
  CHECK_EQ(parse("unix://user:pw@/tmp/r.sock", &u, err), 0);
  CHECK(!strcmp(u.password, "pw"));
  CHECK_EQ(parse("unix://relative.sock", &u, err), -1);
  CHECK(strstr(err, "needs an absolute path") != NULL);
  CHECK_EQ(parse("unix://host/tmp/r.sock", &u, err), -1);
  CHECK(strstr(err, "takes no host") != NULL);
  CHECK_EQ(parse("unix:///tmp/r.sock?verify=0", &u, err), -1);
  CHECK(strstr(err, "takes only ?db=N") != NULL);
  CHECK_EQ(parse("unix:///tmp/r.sock?db=x", &u, err), -1);
  /* the path's limit: sun_path holds 107 bytes and the NUL */
  char big[200] = "unix://";
  memset(big + 7, 'a', 107);
  big[7] = '/';
  big[7 + 107] = 0;
  CHECK_EQ(parse(big, &u, err), 0);
  big[7 + 107] = 'a';
  big[7 + 108] = 0;
  CHECK_EQ(parse(big, &u, err), -1);
  CHECK(strstr(err, "too long") != NULL);
  /* redis:// and rediss:// are not paths */
  CHECK_EQ(parse("rediss://h", &u, err), 0);
  CHECK(u.tls && !u.path[0]);
  CHECK(!strcmp(redis_url_where(&u, where, sizeof(where)), "h:6379"));
}

static void test_tls(void) {
  redis_url_t u;
  char err[256];
  CHECK_EQ(parse("rediss://h", &u, err), 0);
  CHECK(u.tls);
  CHECK(u.verify);
  CHECK_EQ(u.port, 6379);
  CHECK(!u.ca[0] && !u.sni[0] && !u.cert[0] && !u.key[0]);
  CHECK_EQ(parse("rediss://:pw@10.0.0.1:6380/2?ca=/etc/r%20ca.pem&sni=redis.test"
                 "&verify=1",
                 &u, err),
           0);
  CHECK(!strcmp(u.host, "10.0.0.1"));
  CHECK_EQ(u.port, 6380);
  CHECK_EQ(u.db, 2);
  CHECK(!strcmp(u.password, "pw"));
  CHECK(!strcmp(u.ca, "/etc/r ca.pem"));
  CHECK(!strcmp(u.sni, "redis.test"));
  CHECK(u.verify);
  CHECK_EQ(parse("rediss://h/?verify=0", &u, err), 0);
  CHECK(!u.verify);
  CHECK_EQ(parse("rediss://h?verify=false&cert=/c.pem&key=/k.pem", &u, err), 0);
  CHECK(!u.verify);
  CHECK(!strcmp(u.cert, "/c.pem") && !strcmp(u.key, "/k.pem"));
  /* an '@' in the query is not the password's */
  CHECK_EQ(parse("rediss://h:1?ca=/x@y.pem", &u, err), 0);
  CHECK(!strcmp(u.host, "h") && !u.password[0] && !strcmp(u.ca, "/x@y.pem"));
  /* refusals */
  CHECK_EQ(parse("rediss://h?verify=maybe", &u, err), -1);
  CHECK(strstr(err, "verify=") != NULL);
  CHECK_EQ(parse("rediss://h?color=blue", &u, err), -1);
  CHECK(strstr(err, "unknown query parameter") != NULL);
  CHECK_EQ(parse("rediss://h?ca", &u, err), -1);
  CHECK_EQ(parse("rediss://h?cert=/c.pem", &u, err), -1);
  CHECK(strstr(err, "go together") != NULL);
  CHECK_EQ(parse("rediss://h?ca=%zz", &u, err), -1);
  /* the limits: a value that does not fit its field is refused */
  char big[700];
  memset(big, 'a', sizeof(big));
  memcpy(big, "rediss://h?sni=", 15);
  big[15 + 255] = 0; /* 255 bytes: fits (256 with the NUL) */
  CHECK_EQ(parse(big, &u, err), 0);
  CHECK_EQ(strlen(u.sni), 255);
  big[15 + 255] = 'a';
  big[15 + 256] = 0; /* 256: does not */
  CHECK_EQ(parse(big, &u, err), -1);
  CHECK(strstr(err, "too long") != NULL);
  memset(big, 'a', sizeof(big));
  memcpy(big, "rediss://h?ca=", 14);
  big[14 + 511] = 0;
  CHECK_EQ(parse(big, &u, err), 0);
  big[14 + 511] = 'a';
  big[14 + 512] = 0;
  CHECK_EQ(parse(big, &u, err), -1);
}

/* keepalive=SECS on both schemes (default REDIS_KEEPALIVE); TLS's
 * parameters only on rediss:// */
static void test_keepalive(void) {
  redis_url_t u;
  char err[256];
  CHECK_EQ(parse("redis://h", &u, err), 0);
  CHECK_EQ(u.keepalive, REDIS_KEEPALIVE);
  CHECK_EQ(parse("redis://h:7000/2?keepalive=5", &u, err), 0);
  CHECK_EQ(u.keepalive, 5);
  CHECK_EQ(u.db, 2);
  CHECK_EQ(parse("redis://:pa?ss@h?keepalive=0", &u, err), 0);
  CHECK(!strcmp(u.password, "pa?ss"));
  CHECK_EQ(u.keepalive, 0);
  CHECK_EQ(parse("rediss://h?keepalive=30&verify=0", &u, err), 0);
  CHECK_EQ(u.keepalive, 30);
  const char *bad[] = {"redis://h?keepalive=",   "redis://h?keepalive=x",
                       "redis://h?keepalive=-1", "redis://h?keepalive=86401",
                       "redis://h?ca=/x.pem",    "redis://h?verify=0"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    CHECK_EQ(parse(bad[i], &u, err), -1);
    if (parse(bad[i], &u, err) != -1) printf("  %s was taken\n", bad[i]);
  }
}

int main(void) {
  test_plain();
  test_tls();
  test_unix();
  test_keepalive();
  return check_summary();
}
