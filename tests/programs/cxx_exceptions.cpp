/*
 * cxx_exceptions: C++ exceptions thrown through frames that own heap memory
 * (std::string, std::vector, std::map), caught at several depths, rethrown,
 * nested (std::throw_with_nested) and thrown across threads (exception_ptr).
 * The unwinder the agent uses for call stacks must leave the program's own
 * unwinding alone. Prints what it caught; exits 0.
 */
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

struct Failure : std::runtime_error {
    int depth;
    Failure(const std::string &what, int depth) : std::runtime_error(what), depth(depth) {}
};

static int descend(int depth, int throw_at, std::vector<std::unique_ptr<std::string>> &trail) {
    std::vector<int> scratch(64 + depth, depth);
    trail.push_back(std::make_unique<std::string>(std::string(32 + depth, 'a' + depth % 26)));
    if (depth == throw_at) throw Failure("failed at depth " + std::to_string(depth), depth);
    return descend(depth + 1, throw_at, trail) + scratch[0];
}

static void nested(int round) {
    try {
        std::map<int, std::string> table;
        for (int i = 0; i < 50; i++) table[i] = std::string(40, 'x');
        throw std::out_of_range("round " + std::to_string(round));
    } catch (...) {
        std::throw_with_nested(std::runtime_error("nested in round " + std::to_string(round)));
    }
}

static int count_nesting(const std::exception &e) {
    try {
        std::rethrow_if_nested(e);
    } catch (const std::exception &inner) {
        return 1 + count_nesting(inner);
    }
    return 1;
}

int main() {
    long caught = 0, depth_sum = 0, nesting = 0;
    for (int round = 0; round < 2000; round++) {
        std::vector<std::unique_ptr<std::string>> trail;
        try {
            descend(0, round % 40, trail);
        } catch (const Failure &f) {
            caught++;
            depth_sum += f.depth;
        }
        try {
            try {
                nested(round);
            } catch (const std::runtime_error &) {
                throw;  // rethrow the same object
            }
        } catch (const std::exception &e) {
            nesting += count_nesting(e);
        }
    }
    std::exception_ptr from_thread;
    std::thread worker([&] {
        try {
            std::vector<std::string> v(100, "thread");
            throw std::length_error("from a thread with " + std::to_string(v.size()) + " strings");
        } catch (...) {
            from_thread = std::current_exception();
        }
    });
    worker.join();
    std::string message;
    try {
        std::rethrow_exception(from_thread);
    } catch (const std::length_error &e) {
        message = e.what();
    }
    std::printf("caught %ld, depth sum %ld, nesting %ld, %s\n", caught, depth_sum, nesting, message.c_str());
    return 0;
}
