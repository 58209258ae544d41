package reshard

// StreamName exposes streamName to the tests.
var StreamName = streamName
