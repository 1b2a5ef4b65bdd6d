#include <systemd/sd-daemon.h>
#include <systemd/sd-bus.h>
#include <stdint.h>
#include <sys/prctl.h>

/* prctl is variadic, which Swift cannot call; this wrapper makes the process non-dumpable. */
static inline int tokenbroker_set_non_dumpable(void) { return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); }

/* sd_bus_call_method is variadic too: org.freedesktop.Notifications.Notify (no icon, actions or
   hints) on a connection of its own to the user's session bus, waiting at most timeout_usec for
   the answer. Returns 0 or a negative errno. */
static inline int tokenbroker_notify(
    const char *app, const char *summary, const char *body, int32_t expire_ms, uint64_t timeout_usec) {
    sd_bus *bus = NULL;
    int r = sd_bus_open_user(&bus);
    if (r < 0) return r;
    (void) sd_bus_set_method_call_timeout(bus, timeout_usec);
    sd_bus_error error = SD_BUS_ERROR_NULL;
    r = sd_bus_call_method(
        bus, "org.freedesktop.Notifications", "/org/freedesktop/Notifications", "org.freedesktop.Notifications",
        "Notify", &error, NULL, "susssasa{sv}i", app, (uint32_t) 0, "", summary, body, 0, 0, expire_ms);
    sd_bus_error_free(&error);
    sd_bus_flush_close_unref(bus);
    return r < 0 ? r : 0;
}
