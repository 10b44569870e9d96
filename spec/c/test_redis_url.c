/* Unit tests for redis_url_parse (src/redis/redis.h): redis:// as before,
 * and rediss:// with its TLS query parameters and their limits. Own
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
  CHECK(strstr(err, "is not a redis:// URL") != NULL);
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

int main(void) {
  test_plain();
  test_tls();
  return check_summary();
}
