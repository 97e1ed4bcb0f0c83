// e8kv::store's credentials and database numbers: the address forms that carry them, the
// redaction of passwords from every message, and AUTH / SELECT against a redis-server of the test's
// own that wants a password (its default user's, plus an ACL user "fleet"), started with
// with_redis.sh's binary in its directory. Without with_redis.sh's variables the server cases are
// skipped (never passed).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/store/store.hpp"

namespace {

using namespace e8kv::store;
using std::chrono::milliseconds;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

// The message of the e8kv::Error `f` throws ("" and a test failure when it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const e8kv::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no e8kv::Error thrown";
  return "";
}

TEST(StoreAddressCredentials, Forms) {
  auto a = parse_address("redis://:pw@cache:7000/3");
  EXPECT_EQ(a.kind, StoreAddress::Kind::kTcp);
  EXPECT_EQ(a.user, "");
  EXPECT_EQ(a.password, "pw");
  EXPECT_EQ(a.host, "cache");
  EXPECT_EQ(a.port, 7000);
  EXPECT_EQ(a.db, 3);
  a = parse_address("redis://fleet:p%40ss%3Aw%2F@[::1]");  // '@', ':' and '/' percent-encoded
  EXPECT_EQ(a.user, "fleet");
  EXPECT_EQ(a.password, "p@ss:w/");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 6379);
  EXPECT_EQ(a.db, 0);
  a = parse_address("redis://u:a@b@h");  // the last '@' ends the user-info
  EXPECT_EQ(a.password, "a@b");
  EXPECT_EQ(a.host, "h");
  EXPECT_EQ(parse_address("redis://h/2").db, 2);
  EXPECT_EQ(parse_address("redis://h:1/").db, 0);
  a = parse_address("unix:///tmp/r.sock?db=4");
  EXPECT_EQ(a.kind, StoreAddress::Kind::kUnix);
  EXPECT_EQ(a.path, "/tmp/r.sock");
  EXPECT_EQ(a.db, 4);
  a = parse_address("unix://fleet:pw@/run/redis.sock?db=1");
  EXPECT_EQ(a.user, "fleet");
  EXPECT_EQ(a.password, "pw");
  EXPECT_EQ(a.path, "/run/redis.sock");
  EXPECT_EQ(a.db, 1);
  for (const char* bad : {"redis://user@h", "redis://:@h", "redis://h/x", "redis://h/1234567", "redis://:p%4@h",
                          "redis://:p%zz@h", "unix:///s?database=1", "unix:///s?db=1&x=2", "unix:///s?db="}) {
    EXPECT_THROW(parse_address(bad), e8kv::Error) << bad;
  }
}

TEST(StoreAddressCredentials, PasswordsNeverReachMessages) {
  EXPECT_EQ(redact_address("redis://u:pw@h:1/2"), "redis://u:***@h:1/2");
  EXPECT_EQ(redact_address("redis://:pw@h"), "redis://:***@h");
  EXPECT_EQ(redact_address("unix://u:pw@/s.sock?db=1"), "unix://u:***@/s.sock?db=1");
  EXPECT_EQ(redact_address("redis://h:1/2"), "redis://h:1/2");
  EXPECT_EQ(redact_address("unix:///s.sock"), "unix:///s.sock");
  for (const char* bad : {"redis://:topsecret@h:99999", "redis://u:topsecret@h/x", "redis://:topsecret@",
                          "unix://u:topsecret@/s?db=x"}) {
    const std::string msg = error_of([&] { parse_address(bad); });
    EXPECT_EQ(msg.find("topsecret"), std::string::npos) << msg;
    EXPECT_NE(msg.find("***"), std::string::npos) << msg;
  }
}

// A redis-server wanting a password, on a Unix socket and a loopback port, for one test.
class AuthServer {
 public:
  AuthServer() {
    dir_ = env("E8KV_TEST_REDIS_DIR");
    if (dir_.empty()) return;
    sock_ = dir_ + "/auth.sock";
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::close(fd);
    start();
  }
  ~AuthServer() {
    if (!dir_.empty()) stop();
  }
  bool present() const { return !dir_.empty(); }
  void start() {
    const std::string cmd = env("E8KV_TEST_REDIS_SERVER") + " --port " + std::to_string(port_) +
                            " --bind 127.0.0.1 --unixsocket " + sock_ + " --save '' --appendonly no --dir " + dir_ +
                            " --daemonize yes --pidfile " + dir_ + "/auth.pid --logfile " + dir_ +
                            "/auth.log --requirepass adminpw --user fleet on '>fleetpw' '~*' '+@all'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    ASSERT_TRUE(wait_for(true)) << "the password-protected redis-server did not start";
  }
  void stop() {
    std::system(("kill $(cat " + dir_ + "/auth.pid) 2>/dev/null").c_str());
    wait_for(false);
  }
  std::string unix_path() const { return sock_; }
  std::string tcp(const std::string& user_info, const std::string& db) const {
    return "redis://" + user_info + "127.0.0.1:" + std::to_string(port_) + db;
  }

 private:
  bool wait_for(bool up) {
    for (int i = 0; i < 100; ++i) {
      if ((access(sock_.c_str(), F_OK) == 0) == up) return true;
      std::this_thread::sleep_for(milliseconds(50));
    }
    return false;
  }
  std::string dir_, sock_;
  int port_ = 0;
};

TEST(StoreAuth, PasswordUserAndDatabase) {
  AuthServer server;
  if (!server.present()) GTEST_SKIP() << "no redis-server: run through tests/store/with_redis.sh (ctest does)";
  const std::string sock = server.unix_path();

  // No password: the first command is refused with the server's NOAUTH and how to give one.
  auto anonymous = open_store("unix://" + sock);
  std::string msg = error_of([&] { anonymous->get("k"); });
  EXPECT_NE(msg.find("NOAUTH"), std::string::npos) << msg;
  EXPECT_NE(msg.find("E8KV_STORE_PASSWORD"), std::string::npos) << msg;
  // A wrong password: refused on open, the password not in the message.
  msg = error_of([&] { open_store("unix://fleet:wrong-secret-123@" + sock); });
  EXPECT_NE(msg.find("AUTH refused"), std::string::npos) << msg;
  EXPECT_NE(msg.find("WRONGPASS"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("wrong-secret-123"), std::string::npos) << msg;
  // A database the server does not have.
  msg = error_of([&] { open_store(server.tcp(":adminpw@", "/99")); });
  EXPECT_NE(msg.find("SELECT 99 refused"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("adminpw"), std::string::npos) << msg;

  // Database 0 through the default user's password; database 3 through the ACL user over TCP.
  auto db0 = open_store("unix://:adminpw@" + sock);
  auto db3 = open_store(server.tcp("fleet:fleetpw@", "/3"));
  EXPECT_EQ(db3->address(), server.tcp("fleet:***@", "/3"));
  ASSERT_TRUE(db0->put_if_absent("k", bytes_of("zero"), milliseconds(0)));
  ASSERT_TRUE(db3->put_if_absent("k", bytes_of("three"), milliseconds(0)));  // another database: no clash
  EXPECT_EQ(*db0->get("k"), bytes_of("zero"));
  EXPECT_EQ(*db3->get("k"), bytes_of("three"));
  // The same database through the other forms: a Unix address with ?db=, credentials in the options.
  EXPECT_EQ(*open_store("unix://fleet:fleetpw@" + sock + "?db=3")->get("k"), bytes_of("three"));
  StoreOptions o;
  o.user = "fleet";
  o.password = "fleetpw";
  EXPECT_EQ(*open_store("unix://" + sock + "?db=3", o)->get("k"), bytes_of("three"));
  // The environment, as the e8kv tools read it.
  ASSERT_EQ(setenv("E8KV_STORE_PASSWORD", "adminpw", 1), 0);
  unsetenv("E8KV_STORE_USER");
  StoreOptions from_env;
  credentials_from_environment(from_env);
  unsetenv("E8KV_STORE_PASSWORD");
  EXPECT_EQ(from_env.password, "adminpw");
  EXPECT_EQ(from_env.user, "");
  EXPECT_EQ(*open_store("unix://" + sock, from_env)->get("k"), bytes_of("zero"));
  // A user with no password anywhere is refused before connecting.
  StoreOptions user_only;
  user_only.user = "fleet";
  EXPECT_THROW(open_store("unix://" + sock, user_only), e8kv::Error);

  // Every reconnect authenticates and selects again: restart the server under both stores.
  server.stop();
  EXPECT_THROW(db3->get("k"), e8kv::Error);
  server.start();
  EXPECT_FALSE(db3->get("k"));  // no persistence: gone, and no NOAUTH on the new connection
  ASSERT_TRUE(db3->put_if_absent("k2", bytes_of("again"), milliseconds(0)));
  EXPECT_THROW(db0->get("k"), e8kv::Error);  // its connection died with the old server ...
  EXPECT_EQ(db0->exists({"k2"}), std::vector<bool>{false});  // ... and the next call reconnects; db 3 is not 0
  EXPECT_EQ(*db3->get("k2"), bytes_of("again"));
}

}  // namespace
